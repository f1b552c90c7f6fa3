"""Fuzzing `validate` with the project's own layers (Hypothesis): one value of one layer is mutated
(a control character or a shell metacharacter put into a string, or a value replaced by another
type, a huge number, a deep structure), and the layer is read and composed into an image exactly
as `nodeforge validate` does. Whatever the mutation:

- nothing but a definition error (exit 2) comes out: never another exception (a traceback);
- it never hangs (each example runs under an alarm far above its normal time);
- a control character is never accepted anywhere, and a shell metacharacter never where the
  table below says the value is a name, a path, a package or an argument.

The table is written here on purpose, apart from the grammars in builder.definitions: it says what
the destinations need, and the test shows the grammars meet it. A bounded number of examples keeps
it in `make test`; the mutations are drawn fresh each run (a failure prints its reproduction)."""

from __future__ import annotations

import copy
import fnmatch
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from builder.compose.image import compose  # noqa: E402
from builder.definitions.load import Image, Tree, _load_layer, load_tree  # noqa: E402
from builder.errors import Collector, NodeforgeError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 40
ALARM_SECONDS = 120  # a hang guard, not a speed check: a normal example takes well under a second

# characters no definition string may hold (newline and tab are allowed in multi-line text only)
CONTROL = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028"]
LINE_BREAKS = ["\n", "\r", "\t"]
MULTILINE = ["description", "files.*.content", "steps.*.run", "tests.*.command.run", "tests.*.when",
             "tests.*.*.*.contains.*", "tests.*.*.*.not-contains.*", "tests.*.*.*.equals", "asserts.*.that",
             "asserts.*.message", "asserts.*.remedy", "params.*.doc", "tests.*.file.content.*", "*.when",
             "*.*.when", "*.*.*.when", "*.*.*.*.when"]
# shell and config-file metacharacters, and white space
META = [";", "$", "`", "|", "&", "<", ">", "\\", "'", " ", "\"", "#", "*", "(", "{"]
# values that end up as a word of a shell command, a file name, a unit, a module, a package, a
# kernel argument or a pip requirement: none of META may be in them
STRICT = ["name", "requires.*", "provides.*", "conflicts.*", "applies-to.*", "packages.apt.*", "packages.hold.*",
          "packages.pip.*", "packages.pip-target", "packages.repos.*.name", "packages.repos.*.suites.*",
          "packages.repos.*.components.*", "packages.repos.*.key", "packages.repos.*.uri", "files.*.path",
          "files.*.source", "files.*.mode", "files.*.owner", "files.*.group", "kernel.modules.*",
          "kernel.blacklist.*", "services.enable.*", "services.disable.*", "users.*.name", "users.*.groups.*",
          "users.*.shell", "tests.*.file.path", "tests.*.service.name", "tests.*.module.name",
          "tests.*.package.name", "tests.*.env.name", "tests.*.label.name", "tests.*.command.user"]
STRICT += [f"{key}.*.item" for key in ("packages.apt", "packages.hold", "kernel.modules", "kernel.blacklist",
                                         "services.enable", "services.disable")]  # the {item, when} form
# kernel arguments may hold one double-quoted value
STRICT_BUT_QUOTE = ["kernel.args.*", "kernel.args.*.item"]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _matches(path: tuple[Any, ...], patterns: list[str]) -> bool:
    """Whether path fits a pattern key by key: a `*` stands for one key or index, never for several
    (`services.enable.*` is an item, not the `when` of an {item, when} item)."""
    def fits(keys: list[str], pattern: list[str]) -> bool:
        return len(keys) == len(pattern) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, pattern, strict=True))
    general = ["*" if isinstance(p, int) else str(p) for p in path]
    concrete = [str(p) for p in path]
    return any(fits(general, p.split(".")) or fits(concrete, p.split(".")) for p in patterns)


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


LAYERS = sorted(p.parent.name for p in (ROOT / "layers").glob("*/layer.yaml"))
RAW = {name: yaml.safe_load((ROOT / "layers" / name / "layer.yaml").read_text()) for name in LAYERS}
LEAVES = [(name, path, value) for name in LAYERS for path, value in _leaves(RAW[name]) if path]
STRING_LEAVES = [leaf for leaf in LEAVES if isinstance(leaf[2], str)]
STRICT_LEAVES = [leaf for leaf in STRING_LEAVES if _matches(leaf[1], STRICT + STRICT_BUT_QUOTE)]


@pytest.fixture(scope="module")
def real_tree() -> Tree:
    return load_tree(ROOT)


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError(f"validate ran longer than {ALARM_SECONDS} s on one mutated layer (a hang)")


def validate_layer(tree: Tree, name: str, doc: Any, scratch: Path) -> list[str]:
    """What `nodeforge validate` does for one layer: read it (schema, paths), then compose it into
    an image of each kind it applies to with the project's other layers. Problems, or [] if accepted."""
    d = scratch / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "layer.yaml").write_text(yaml.safe_dump(doc, allow_unicode=False, sort_keys=False))
    if not (d / "files").exists() and (ROOT / "layers" / name / "files").is_dir():
        shutil.copytree(ROOT / "layers" / name / "files", d / "files")  # a link at files/ is refused
    out = Collector()
    layer = _load_layer(scratch, d, out)
    if out.problems or layer is None:
        return [p.render() for p in out.problems] or ["not loaded"]
    problems: list[str] = []
    kinds = layer.data["applies-to"]
    for kind in kinds:
        raw = {"name": "fuzz", "summary": "fuzz", "kind": kind, "from": {"debian": {"suite": "bookworm"}},
               "source-date-epoch": 1700000000, "layers": [name]}
        from builder.definitions.spec import validate
        from builder.definitions.tables import IMAGE

        image = Image("fuzz", "images/fuzz.yaml", validate(IMAGE, raw, "images/fuzz.yaml", Collector()), raw,
                      layer_refs=((name, {}, None),))
        mutated = Tree(tree.root, {**tree.layers, name: layer}, {**tree.images, "fuzz": image}, tree.configs)
        try:
            compose(mutated, "fuzz", None, [])
        except NodeforgeError as e:
            problems += [p.render() for p in e.problems] or [str(e)]
    return problems


def run_guarded(tree: Tree, name: str, doc: Any, scratch: Path) -> list[str]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_SECONDS)
    try:
        return validate_layer(tree, name, doc, scratch)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_project_layers_validate_unchanged(real_tree: Tree, tmp_path: Path) -> None:
    """The harness itself: an unmutated layer is accepted (else the properties below prove nothing)."""
    for name in ("kernel-args", "sysctl", "nvidia-driver", "app-user"):
        assert run_guarded(real_tree, name, copy.deepcopy(RAW[name]), tmp_path / name) == []


def test_the_table_covers_the_layers() -> None:
    assert len(STRICT_LEAVES) >= 50 and len(STRING_LEAVES) > len(STRICT_LEAVES)
    # a `when:` is a template, where `;` or a space is plain text: never held to a word's grammar
    assert not [leaf for leaf in STRICT_LEAVES if leaf[1][-1] == "when"]


def _insert(value: str, char: str, where: int) -> str:
    i = {0: 0, 1: len(value), 2: len(value) // 2}[where]
    return value[:i] + char + value[i:]


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(leaf=st.sampled_from(STRING_LEAVES), char=st.sampled_from(CONTROL + LINE_BREAKS),
       where=st.sampled_from([0, 1, 2]))
def test_a_control_character_is_never_accepted(real_tree: Tree, tmp_path_factory: pytest.TempPathFactory,
                                                leaf: tuple[str, tuple[Any, ...], str], char: str,
                                                where: int) -> None:
    name, path, value = leaf
    if char in LINE_BREAKS and _matches(path, MULTILINE):
        return  # newline and tab belong in multi-line text
    doc = copy.deepcopy(RAW[name])
    _set(doc, path, _insert(value, char, where))
    problems = run_guarded(real_tree, name, doc, tmp_path_factory.mktemp("fuzz"))
    assert problems, f"accepted {char!r} in layers/{name}/layer.yaml {_dotted(path)}"


@FUZZ
@given(leaf=st.sampled_from(STRICT_LEAVES), char=st.sampled_from(META), where=st.sampled_from([0, 1]))
def test_a_shell_metacharacter_is_never_accepted_where_the_grammar_forbids_it(
        real_tree: Tree, tmp_path_factory: pytest.TempPathFactory, leaf: tuple[str, tuple[Any, ...], str],
        char: str, where: int) -> None:
    name, path, value = leaf
    if char == '"' and _matches(path, STRICT_BUT_QUOTE):
        return
    doc = copy.deepcopy(RAW[name])
    _set(doc, path, _insert(value, char, where))
    problems = run_guarded(real_tree, name, doc, tmp_path_factory.mktemp("fuzz"))
    assert problems, f"accepted {char!r} in layers/{name}/layer.yaml {_dotted(path)}: {doc!r}"


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**31),
    st.floats(allow_nan=True), st.text(max_size=40), st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=2), max_leaves=40),
    st.sampled_from(["{{ x.__class__ }}", "{{ 9 ** 99999 }}", "{% include '/etc/passwd' %}", "{{ }}",
                     "{{ range(10**9) | list }}", "/", "/etc/../x", "0644", "((a+)+)", "[z-a]"]),
)


@FUZZ
@given(leaf=st.sampled_from(LEAVES), replacement=ODD_VALUES)
def test_a_value_of_another_type_never_crashes(real_tree: Tree, tmp_path_factory: pytest.TempPathFactory,
                                               leaf: tuple[str, tuple[Any, ...], Any], replacement: Any) -> None:
    name, path, _ = leaf
    doc = copy.deepcopy(RAW[name])
    _set(doc, path, replacement)
    run_guarded(real_tree, name, doc, tmp_path_factory.mktemp("fuzz"))  # any exception but exit 2 fails


# --- images, configs and --set --------------------------------------------------------------------
# The same properties for the other definitions: one value of one image or config is mutated, the
# tree is read as `nodeforge validate` reads it and the image (or an image, with the mutated config)
# composed; a --set string of any text is parsed and composed as `nodeforge plan --set` does.

DOCS = {(kind, p.stem): yaml.safe_load(p.read_text()) for kind in ("images", "configs")
        for p in sorted((ROOT / kind).glob("*.yaml"))}
DOC_LEAVES = [(key, path, value) for key, doc in DOCS.items() for path, value in _leaves(doc) if path]
DOC_STRING_LEAVES = [leaf for leaf in DOC_LEAVES if isinstance(leaf[2], str)]
IMAGE_NAMES = sorted(name for kind, name in DOCS if kind == "images")
CONFIG_NAMES = sorted(name for kind, name in DOCS if kind == "configs")
SET_TARGETS = sorted(f"{name}.{param}" for name in LAYERS for param in (RAW[name].get("params") or {}))
DOC_EXAMPLES = 25  # each composes an image (a few tenths of a second)


@pytest.fixture(scope="module")
def doc_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's definitions; each example rewrites one image or config and restores it."""
    root = tmp_path_factory.mktemp("doc-fuzz")
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, root / d)
    return root


def validate_doc(root: Path, kind: str, name: str, doc: Any, other: str) -> list[str]:
    """The mutated images/<name>.yaml or configs/<name>.yaml read with the whole tree, then composed:
    the image itself with config `other`, or image `other` with the config. Problems, or []."""
    path = root / kind / f"{name}.yaml"
    original = path.read_bytes()
    path.write_text(yaml.safe_dump(doc, allow_unicode=False, sort_keys=False))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_SECONDS)
    try:
        tree = load_tree(root)
        image, config = (name, other) if kind == "images" else (other, name)
        compose(tree, image, config, [])
        return []
    except NodeforgeError as e:
        return [p.render() for p in e.problems] or [str(e)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        path.write_bytes(original)


def test_the_project_images_and_configs_validate_unchanged(doc_tree: Path) -> None:
    assert validate_doc(doc_tree, "images", "gpu-node", copy.deepcopy(DOCS["images", "gpu-node"]), "dgx-h100") == []
    assert validate_doc(doc_tree, "configs", "v100-slurm", copy.deepcopy(DOCS["configs", "v100-slurm"]),
                        "node-minimal") == []


DOC_FUZZ = settings(FUZZ, max_examples=DOC_EXAMPLES)


@DOC_FUZZ
@given(leaf=st.sampled_from(DOC_STRING_LEAVES), char=st.sampled_from(CONTROL + LINE_BREAKS),
       where=st.sampled_from([0, 1, 2]), other=st.data())
def test_a_control_character_in_an_image_or_config_is_never_accepted(
        doc_tree: Path, leaf: tuple[tuple[str, str], tuple[Any, ...], str], char: str, where: int,
        other: st.DataObject) -> None:
    (kind, name), path, value = leaf
    if char in LINE_BREAKS and _matches(path, MULTILINE):
        return
    doc = copy.deepcopy(DOCS[kind, name])
    _set(doc, path, _insert(value, char, where))
    partner = other.draw(st.sampled_from(CONFIG_NAMES if kind == "images" else IMAGE_NAMES))
    problems = validate_doc(doc_tree, kind, name, doc, partner)
    assert problems, f"accepted {char!r} in {kind}/{name}.yaml {_dotted(path)}"


@DOC_FUZZ
@given(leaf=st.sampled_from(DOC_LEAVES), replacement=ODD_VALUES, other=st.data())
def test_a_value_of_another_type_in_an_image_or_config_never_crashes(
        doc_tree: Path, leaf: tuple[tuple[str, str], tuple[Any, ...], Any], replacement: Any,
        other: st.DataObject) -> None:
    (kind, name), path, _ = leaf
    doc = copy.deepcopy(DOCS[kind, name])
    _set(doc, path, replacement)
    partner = other.draw(st.sampled_from(CONFIG_NAMES if kind == "images" else IMAGE_NAMES))
    validate_doc(doc_tree, kind, name, doc, partner)  # any exception but exit 2 fails


SET_VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(['"a\\nb"', '"\\x1b[2J"', "'x'", "[a, \"\\u2028\"]", '{a: "\\x07"}', "[1, [2]]", "null",
                     "{replace: [a]}", "&a [*a]", "9" * 40, "!!python/object:os.system x", "[", "=", "+=",
                     "{{ 7 * 7 }}", "a; touch /tmp/x", "--", "\\", "0x1f", "1e999"]))


def _has_control(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_control(k) or _has_control(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_control(v) for v in value)
    return isinstance(value, str) and any(c in value for c in CONTROL + LINE_BREAKS + ["\x1f", "\u2029"])


@DOC_FUZZ
@given(target=st.one_of(st.sampled_from(SET_TARGETS), st.text(max_size=20)), append=st.booleans(),
       value=SET_VALUES)
def test_any_set_string_gives_a_plan_or_exit_2(real_tree: Tree, target: str, append: bool, value: str) -> None:
    """`--set TARGET=VALUE` (or +=): a plan or a usage/definition error, never another exception; and
    a value holding a control character, as written or once its YAML quoting is decoded, is refused."""
    from builder.compose.params import parse_sets

    item = f"{target}{'+' if append else ''}={value}"
    try:
        decoded = yaml.safe_load(value)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        decoded = value
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_SECONDS)
    try:
        compose(real_tree, "gpu-node", "default", parse_sets([item]))
    except NodeforgeError:
        return
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not _has_control(value) and not _has_control(decoded), f"accepted --set {item!r}"
