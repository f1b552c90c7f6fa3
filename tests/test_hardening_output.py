"""Issue 21, what people read and where exports write (no engine needed):

- one escaping helper (builder.escaping) for every human-facing writer: a manifest whose names and
  values hold a Markdown heading, a link, HTML, terminal escapes and newlines diffs to Markdown in
  which they are inert and to text without a control character; errors, progress and explain too;
- `diff A.json B.json` reads manifests through the one document reader: any shape is exit 2 naming
  the file and key, a FIFO is refused at once;
- `import oci` checks the layout (schemas, blob digests and sizes, blob paths) before using it;
- `export oci` and `export packer` never delete or overwrite a directory they did not make for the
  same image, never write into the project tree, and leave nothing half-written;
- a Hypothesis fuzz of both readers: only usage errors, never a traceback or a hang."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from builder.compose.explain import explain
from builder.compose.image import compose
from builder.definitions import destination
from builder.definitions.load import load_tree
from builder.diff import diff_manifests
from builder.errors import NodeforgeError, Problem, UsageError
from builder.escaping import for_markdown_cell, for_markdown_text, for_terminal
from builder.export import oci
from builder.export import packer as packer_export
from builder.manifest import compare, document, oci_image
from builder.plan import Value
from builder.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ["### Security review: APPROVED", "[approve](https://evil.example/x)", "<script>alert(1)</script>",
           "\x1b[2J\x1b[1;1Hall clear", "line one\n## Injected heading\n| a | b |", "\x9b31mC1 CSI", "\u202eevil",
           "https://evil.example/plain www.evil.example", "- [x] approved", "1. approved", "`code` **bold**"]
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def manifest(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": 2, "image": "n", "kind": "node", "version": "1.0", "config": "default", "sets": [],
        "plan_key": "a" * 64, "image_digest": "sha256:" + "1" * 64, "registry_digest": None,
        "base": {"kind": "debian", "key": "b" * 64},
        "layers": [{"name": "base", "image": "n", "key": "c" * 64,
                    "parameters": {"tools": {"value": ["procps"], "source": "default"}}}],
        "packages": [{"name": "curl", "version": "7.88.1-10", "architecture": "amd64"}],
        "wheels": [], "kernel_cmdline": "root=LABEL=r ro", "outputs": {"disk.raw": {"role": "raw", "sha256": "3" * 64}},
        "lock": None, "inherited_locks": [], "builder": {"name": "nodeforge", "version": "0.1.0"},
    }
    doc.update(changes)
    return doc


def hostile_manifest() -> dict[str, Any]:
    """Every hostile string as a package name and version, a parameter value and source, a layer
    and an output name, the image name and version, and the kernel command line."""
    doc = manifest(image=HOSTILE[0] + "\n" + HOSTILE[4], version=HOSTILE[3], kernel_cmdline=" ".join(HOSTILE))
    doc["packages"] += [{"name": h, "version": h, "architecture": None} for h in HOSTILE]
    doc["layers"][0]["parameters"].update({f"p{i}": {"value": h, "source": h} for i, h in enumerate(HOSTILE)})
    doc["layers"] += [{"name": h, "key": h, "image": "n"} for h in HOSTILE]
    doc["outputs"].update({h: {"role": "file", "sha256": h} for h in HOSTILE})
    return doc


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"}, timeout=120)


# --- the helper --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", HOSTILE)
def test_every_escape_is_one_printable_line(value: str) -> None:
    for shown in (for_terminal(value), for_markdown_text(value), for_markdown_cell(value)):
        assert "\n" not in shown and not CONTROL.search(shown) and shown.isprintable()
    assert for_terminal("\x1b[2J") == "\\x1b[2J" and for_terminal("a\nb") == "a\\nb"
    assert for_terminal("plain text: ok") == "plain text: ok"


def test_markdown_text_is_inert() -> None:
    assert for_markdown_text("### Security review: APPROVED").startswith("\\#\\#\\#")
    assert "](" not in for_markdown_text("[approve](https://evil.example/x)")
    assert "<" not in for_markdown_text("<script>").replace("\\<", "")
    assert for_markdown_text("- [x] approved").startswith("\\-")
    assert for_markdown_text("1. approved") == "1\\. approved"
    assert for_markdown_text("n 1.0") == "n 1.0"  # nothing to escape stays as it is


def test_markdown_cells_are_code_spans_whatever_they_hold() -> None:
    assert for_markdown_cell("a|b") == "`a\\|b`"
    assert for_markdown_cell("x `y`") == "`` x `y` ``"  # the fence outlasts the value's backticks
    assert for_markdown_cell("``") == "``` `` ```"
    assert for_markdown_cell("two\nlines") == "`two\\nlines`"
    assert for_markdown_cell("") == ""


# --- item 7: the writers -----------------------------------------------------------------------

def _markdown_is_inert(md: list[str]) -> None:
    ours = {"## ", "### ", "| ", "|---", "**", ""}
    for line in md:
        assert "\n" not in line and not CONTROL.search(line), line
        assert any(line.startswith(p) for p in ours) or line == "", line
        assert not line.startswith("## ") or line.startswith("## Rollout review: "), line
        assert not line.startswith("### ") or line[4:] in {"Build", "Layers", "Parameters", "Packages", "Wheels",
                                                          "Kernel command line", "Outputs"}, line
    body = "\n".join(md)
    text = re.sub(r"(`+) .*? \1|(`+)[^`]*?\2", "", body)  # outside code spans:
    assert not re.search(r"(?<!\\)\]\(|(?<!\\)<[a-z/]|(?<!\\)https?://|(?<!\\)\bwww\.", text), text


def test_a_hostile_manifest_diffs_to_inert_markdown_and_plain_text(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", manifest())
    b = write(tmp_path / "b.json", hostile_manifest())
    md, changed = diff_manifests(str(a), str(b), "markdown")
    assert changed
    _markdown_is_inert(md)
    rows = [line for line in md if line.startswith("| ")]
    for i, line in enumerate(md):  # every table row has its header's cells: no value split a row
        if line.startswith("| change |"):
            width = line.count("|")
            for row in md[i + 2:]:
                if not row.startswith("|"):
                    break
                assert len(re.findall(r"(?<!\\)\|", row)) == width, row
    assert rows and md[0].startswith("## Rollout review: ")
    text, _ = diff_manifests(str(a), str(b), "text")
    for line in text:
        assert "\n" not in line and not CONTROL.search(line), line
    assert any("\\x1b[2J" in line for line in text)  # shown, not sent


def test_the_cli_prints_no_control_character(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", manifest())
    b = write(tmp_path / "b.json", hostile_manifest())
    for fmt in ("text", "markdown"):
        proc = run_cli("diff", str(a), str(b), "--format", fmt)
        assert proc.returncode == 1, proc.stderr
        assert not CONTROL.search(proc.stdout.replace("\n", ""))
        if fmt == "markdown":
            _markdown_is_inert(proc.stdout.splitlines())


def test_errors_progress_and_explain_show_values_escaped(tmp_path: Path) -> None:
    p = Problem("lay\x1bers/x.yaml", 3, "files[0].path\n", "found '\x1b]0;pwned\x07'", "remove \x1b[2J it")
    text = p.render()
    assert text.count("\n") == 1 and not CONTROL.search(text.replace("\n", "")), text
    assert "\\x1b]0;pwned\\x07" in text
    out = io.StringIO()
    Progress(out).say("img\x1b[2J", "layer x\nfake line\x1b[31m")
    assert out.getvalue() == "[img\\x1b[2J] layer x\\nfake line\\x1b[31m\n"
    plan = compose(load_tree(small_tree(tmp_path)), "small-node")
    params = {**plan.params, "sysctl.x": Value("v\x1b[2J\n  key   forged", "--set \x1b[31m")}
    shown = explain(dataclasses.replace(plan, image="n\x1b[2J\nimage forged", params=params), provenance=True)
    assert not CONTROL.search(shown.replace("\n", "")) and "forged" in shown
    assert not any(line.startswith(("image forged", "  key   forged")) for line in shown.splitlines())


# --- manifests: every shape is a usage error ---------------------------------------------------

SHAPES: list[Any] = [
    [], "manifest", 2, None, {"format": 2}, {"format": True, "layers": []}, {"format": 3},
    manifest(layers=[1]), manifest(layers=[{"name": "x", "parameters": []}]),
    manifest(layers=[{"name": "x", "parameters": {"p": {"source": "s"}}}]),
    manifest(packages=[{"name": "x"}]), manifest(packages={"x": 1}), manifest(wheels=[{"version": 1}]),
    manifest(outputs={"x": {"role": "raw"}}), manifest(outputs=[]), manifest(lock={"path": "x"}),
    manifest(source={"dirty": True}), manifest(plan_key=None), manifest(version=1), manifest(kernel_cmdline=[]),
    manifest(image={"a": 1}), manifest(base=json.loads("[" * 100 + "]" * 100)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=range(len(SHAPES)))
def test_any_manifest_shape_is_a_usage_error_naming_the_file(tmp_path: Path, shape: Any) -> None:
    a = write(tmp_path / "a.json", manifest())
    bad = write(tmp_path / "bad.json", shape)
    with pytest.raises(UsageError) as e:
        diff_manifests(str(a), str(bad))
    assert str(bad) in e.value.render()


def test_a_manifest_error_names_the_key_and_exits_2(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", manifest())
    bad = write(tmp_path / "bad.json", manifest(packages=[{"name": "x", "version": 7}]))
    proc = run_cli("diff", str(a), str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "packages[0].version" in proc.stderr and "expected a string, found int 7" in proc.stderr


def test_a_fifo_manifest_is_refused_at_once(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", manifest())
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    proc = run_cli("diff", str(a), str(fifo))  # run_cli's timeout fails the test on a hang
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_unknown_keys_of_a_later_format_are_ignored(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", manifest())
    b = write(tmp_path / "b.json", manifest(future={"x": 1}, packages=[{"name": "curl", "version": "7.88.1-10",
                                                                       "architecture": "amd64", "new": 1}]))
    assert diff_manifests(str(a), str(b)) == (["--- " + compare.describe(str(a), document.load(a)),
                                               "+++ " + compare.describe(str(b), document.load(b))], False)


# --- import oci: the layout reader -------------------------------------------------------------

def make_layout(root: Path, name: str = "example/app:1.0") -> Path:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        info = tarfile.TarInfo("etc/app.conf")
        info.size = 4
        t.addfile(info, io.BytesIO(b"x=1\n"))
    tar = root / "layer.tar"
    tar.write_bytes(layer.getvalue())
    config = {"architecture": "amd64", "os": "linux", "config": {},
              "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "step"}]}
    oci.write_layout(config, [tar], name, 1735689600, root / "layout")
    return root / "layout"


def blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def test_a_layout_nodeforge_wrote_is_read(tmp_path: Path) -> None:
    layout = make_layout(tmp_path)
    assert oci.verify_layout(layout) == oci.manifest_digest(layout)
    assert oci.layout_repository(layout) == "example/app"


def _rewrite_index(layout: Path, change: Any) -> None:
    index = json.loads((layout / "index.json").read_text())
    change(index)
    (layout / "index.json").write_text(json.dumps(index))


def _damage_layer(layout: Path) -> None:
    manifest_doc = json.loads(blob(layout, oci.manifest_digest(layout)).read_bytes())
    path = blob(layout, manifest_doc["layers"][0]["digest"])
    data = bytearray(path.read_bytes())
    data[600] ^= 1
    path.write_bytes(bytes(data))


LAYOUT_FAULTS: dict[str, Any] = {
    "no index": lambda lay: (lay / "index.json").unlink(),
    "index a list": lambda lay: (lay / "index.json").write_text("[]"),
    "no manifests": lambda lay: _rewrite_index(lay, lambda i: i.pop("manifests")),
    "two manifests": lambda lay: _rewrite_index(lay, lambda i: i["manifests"].append(i["manifests"][0])),
    "a digest with a path": lambda lay: _rewrite_index(lay, lambda i: i["manifests"][0].update(
        digest="sha256:../../../../etc/passwd")),
    "a wrong size": lambda lay: _rewrite_index(lay, lambda i: i["manifests"][0].update(size=5)),
    "a missing blob": lambda lay: _rewrite_index(lay, lambda i: i["manifests"][0].update(digest="sha256:" + "0" * 64)),
    "a damaged layer": _damage_layer,
    "no oci-layout": lambda lay: (lay / "oci-layout").unlink(),
    "a nested index": lambda lay: _rewrite_index(lay, lambda i: i["manifests"][0].update(
        mediaType="application/vnd.oci.image.index.v1+json")),
}


@pytest.mark.parametrize("fault", list(LAYOUT_FAULTS))
def test_a_faulty_layout_is_a_usage_error(tmp_path: Path, fault: str) -> None:
    layout = make_layout(tmp_path)
    LAYOUT_FAULTS[fault](layout)
    with pytest.raises(UsageError):
        oci.verify_layout(layout)


def test_a_fifo_or_link_blob_is_refused_without_waiting(tmp_path: Path) -> None:
    layout = make_layout(tmp_path)
    path = blob(layout, oci.manifest_digest(layout))
    saved = path.read_bytes()
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(UsageError, match="not a regular file"):
        oci.verify_layout(layout)
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(saved)
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="cannot be read"):
        oci.verify_layout(layout)


def test_import_of_a_damaged_layout_exits_2_before_skopeo(tmp_path: Path) -> None:
    layout = make_layout(tmp_path)
    _damage_layer(layout)
    proc = run_cli("import", "oci", str(layout), "--registry", "127.0.0.1:1")
    assert proc.returncode == 2 and "does not match its digest" in proc.stderr and "Traceback" not in proc.stderr


# --- item 11: export destinations --------------------------------------------------------------

def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


@pytest.fixture
def fake_save(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`docker save` without the engine: one small layer."""
    def save(c: Any, ref: str, into: Path) -> tuple[dict[str, Any], list[Path]]:
        tar = into / "layer.tar"
        with tarfile.open(tar, "w") as t:
            info = tarfile.TarInfo("etc/app.conf")
            info.size = len(ref)
            t.addfile(info, io.BytesIO(ref.encode()))
        return {"architecture": "amd64", "os": "linux", "history": [{"created_by": "x"}]}, [tar]

    monkeypatch.setattr(oci, "save", save)
    yield


def test_export_oci_refuses_another_layout_and_keeps_its_blobs(tmp_path: Path, fake_save: None) -> None:
    other = make_layout(tmp_path)  # another tool's (or image's) layout: no marker of ours
    before = listing(other)
    with pytest.raises(UsageError, match="was not made by `nodeforge export oci`"):
        oci.export(None, "nodeforge/mine:1", 1735689600, other)  # type: ignore[arg-type]
    assert listing(other) == before
    mine = tmp_path / "mine"
    digest = oci.export(None, "nodeforge/mine:1", 1735689600, mine)  # type: ignore[arg-type]
    assert oci.verify_layout(mine) == digest and (mine / ".nodeforge-export-oci").is_file()
    assert oci.export(None, "nodeforge/mine:2", 1735689600, mine) != digest  # type: ignore[arg-type]
    kept = listing(mine)
    with pytest.raises(UsageError, match="of image nodeforge/mine, not of image nodeforge/theirs"):
        oci.export(None, "nodeforge/theirs:1", 1735689600, mine)  # type: ignore[arg-type]
    assert listing(mine) == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layout", "mine"]  # no temporary left


def test_export_oci_never_writes_into_the_project_tree(tmp_path: Path, fake_save: None) -> None:
    project = small_tree(tmp_path)
    before = listing(project)
    for dest in (project, project / "layers", project / "images" / "out", project.parent):
        with pytest.raises(UsageError, match=r"export oci: .*project tree"):
            oci.export(None, "nodeforge/x:1", 1735689600, dest, project=project)  # type: ignore[arg-type]
    assert listing(project) == before
    oci.export(None, "nodeforge/x:1", 1735689600, project / "build" / "oci", project=project)  # type: ignore[arg-type]


def test_a_failed_export_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any) -> Any:
        raise NodeforgeError("the engine went away")

    monkeypatch.setattr(oci, "save", fail)
    with pytest.raises(NodeforgeError):
        oci.export(None, "nodeforge/x:1", 1735689600, tmp_path / "out")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_export_packer_into_the_project_root_is_refused(tmp_path: Path) -> None:
    project = small_tree(tmp_path)
    tree = load_tree(project)
    before = listing(project)
    for dest in (project, project / "layers", Path(os.path.relpath(project))):
        with pytest.raises(UsageError, match=r"export packer: .*project tree"):
            packer_export.export(tree, "small-node", None, [], dest)
    assert listing(project) == before


def test_export_packer_keeps_a_directory_it_did_not_make(tmp_path: Path) -> None:
    tree = load_tree(small_tree(tmp_path / "p"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    with pytest.raises(UsageError, match="was not made by `nodeforge export packer`"):
        packer_export.export(tree, "small-node", None, [], mine)
    assert [p.name for p in mine.iterdir()] == ["precious.txt"]


def test_replacing_carries_what_the_command_does_not_own(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with destination.replacing(dest, None, "export packer", "image n") as tmp:
        (tmp / "template.json").write_text("1")
    (dest / "output-n").mkdir()
    (dest / "output-n" / "n.qcow2").write_text("built by packer")
    with destination.replacing(dest, None, "export packer", "image n", keep=lambda n: n != "template.json") as tmp:
        (tmp / "template.json").write_text("2")
    assert (dest / "template.json").read_text() == "2" and (dest / "output-n" / "n.qcow2").is_file()
    with pytest.raises(RuntimeError), destination.replacing(dest, None, "export packer", "image n") as tmp:
        (tmp / "template.json").write_text("3")
        raise RuntimeError("the build failed")
    assert (dest / "template.json").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


SMALL_NODE = """name: small-node
summary: a small node image
kind: node
version: "1"
from:
  debian: {suite: bookworm, components: [main, contrib, non-free, non-free-firmware]}
source-date-epoch: 1735689600
layers: [base, kernel, sysctl]
outputs:
  tags: [nodeforge-test/small-node:1]
"""


def small_tree(root: Path) -> Path:
    """A project tree of a few of the project's layers and one node image."""
    project = root / "project"
    for layer in ("base", "kernel", "sysctl", "packer-access"):
        shutil.copytree(ROOT / "layers" / layer, project / "layers" / layer)
    (project / "images").mkdir()
    (project / "images" / "small-node.yaml").write_text(SMALL_NODE)
    (project / "configs").mkdir()
    return project


# --- fuzz: random JSON shapes into both readers ------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 60
ALARM_SECONDS = 60
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**31),
                    st.floats(allow_nan=False), st.text(max_size=20), st.sampled_from(HOSTILE))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=20)


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError(f"a reader ran longer than {ALARM_SECONDS} s (a hang)")


def _guarded(fn: Any, *args: Any) -> Any:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_SECONDS)
    try:
        return fn(*args)
    except UsageError:
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*path, i))
    return out


def _mutate(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


@FUZZ
@given(data=st.data(), value=JSON)
def test_fuzz_a_manifest_shape_is_only_a_usage_error(tmp_path_factory: pytest.TempPathFactory, data: Any,
                                                     value: Any) -> None:
    base = hostile_manifest()
    where = data.draw(st.sampled_from(_paths(base)))
    tmp = tmp_path_factory.mktemp("fuzz-manifest")
    a = write(tmp / "a.json", manifest())
    b = write(tmp / "b.json", _mutate(base, where, value))
    for fmt in ("text", "markdown"):
        result = _guarded(diff_manifests, str(a), str(b), fmt)
        if result is not None:
            assert all("\n" not in line and not CONTROL.search(line) for line in result[0])


@FUZZ
@given(data=st.data(), value=JSON, which=st.sampled_from(["index", "manifest", "config", "oci-layout"]))
def test_fuzz_a_layout_shape_is_only_a_usage_error(tmp_path_factory: pytest.TempPathFactory, data: Any,
                                                   value: Any, which: str) -> None:
    layout = make_layout(tmp_path_factory.mktemp("fuzz-layout"))
    index_path = layout / "index.json"
    manifest_path = blob(layout, oci.manifest_digest(layout))
    config_path = blob(layout, json.loads(manifest_path.read_bytes())["config"]["digest"])
    path = {"index": index_path, "manifest": manifest_path, "config": config_path,
            "oci-layout": layout / "oci-layout"}[which]
    doc = json.loads(path.read_bytes())
    where = data.draw(st.sampled_from(_paths(doc)))
    data_bytes = oci_image.canonical(_mutate(doc, where, value))
    if which in ("manifest", "config"):  # a consistent layout around the mutated blob: its digest and size
        new = blob(layout, "sha256:" + hashlib.sha256(data_bytes).hexdigest())
        new.write_bytes(data_bytes)
        parent_path = index_path if which == "manifest" else manifest_path
        parent = json.loads(parent_path.read_bytes())
        entry = parent["manifests"][0] if which == "manifest" else parent["config"]
        entry.update(digest="sha256:" + hashlib.sha256(data_bytes).hexdigest(), size=len(data_bytes))
        parent_bytes = oci_image.canonical(parent)
        if which == "config":  # the manifest moved too: the index names its new digest
            new_manifest = blob(layout, "sha256:" + hashlib.sha256(parent_bytes).hexdigest())
            new_manifest.write_bytes(parent_bytes)
            _rewrite_index(layout, lambda i: i["manifests"][0].update(
                digest="sha256:" + hashlib.sha256(parent_bytes).hexdigest(), size=len(parent_bytes)))
        else:
            parent_path.write_bytes(parent_bytes)
    else:
        path.write_bytes(data_bytes)
    _guarded(oci.verify_layout, layout)
    _guarded(oci.layout_repository, layout)
