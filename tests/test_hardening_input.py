"""Definition and composition input (issue 21, items 1, 6, 12 and the low ones on input): links out
of the tree, control characters that appear once a value is decoded or rendered, reserved parameter
names, --set values no image uses, errors that name the config at fault, and one path written by
two layers. Every case: exit 2, file, line and key named, no traceback, nothing written."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.cli import main
from builder.compose import image as image_mod
from builder.compose import render
from builder.compose.image import compose
from builder.compose.params import parse_sets
from builder.definitions.load import RESERVED_PARAMS, load_tree
from builder.errors import NodeforgeError

ROOT = Path(__file__).resolve().parent.parent


def nodeforge(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line in process; an exception other than the tool's own errors fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--root", str(tree), *args])
        except SystemExit as e:
            code = int(e.code or 0)
    return subprocess.CompletedProcess(["nodeforge", *args], code, out.getvalue(), err.getvalue())


def refused(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in proc.stderr, f"{text!r} not in:\n{proc.stderr}"


def layer(tree: Path, name: str, body: str) -> Path:
    d = tree / "layers" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "layer.yaml").write_text(f"name: {name}\nsummary: a test layer\n{body}")
    return d


def image(tree: Path, name: str, layers: str, kind: str = "container", extra: str = "") -> None:
    (tree / "images" / f"{name}.yaml").write_text(
        f"name: {name}\nsummary: s\nkind: {kind}\nfrom: {{debian: {{suite: bookworm}}}}\n"
        f"source-date-epoch: 1700000000\nlayers: [{layers}]\n{extra}")


# --- 1. links out of the tree ----------------------------------------------------------------------

def test_a_files_directory_that_is_a_link_is_refused(scratch_tree: Path, tmp_path: Path) -> None:
    """files -> /etc validated before (the source was checked against the resolved files/), and
    render copied the host's file into the build context."""
    d = layer(scratch_tree, "leak", "files:\n  - {path: /etc/leaked, source: passwd}\n")
    (d / "files").symlink_to("/etc")
    image(scratch_tree, "leaky", "base, leak")
    refused(nodeforge(scratch_tree, "validate"), "layers/leak:", "symbolic link layers/leak/files -> '/etc'",
            "replace the link by a directory")
    out = tmp_path / "ctx"
    refused(nodeforge(scratch_tree, "render", "leaky", str(out)))
    assert not out.exists()


def test_a_layer_directory_that_is_a_link_is_refused(scratch_tree: Path,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "elsewhere"
    (outside / "files").mkdir(parents=True)
    (outside / "files" / "x").write_text("x")
    (outside / "layer.yaml").write_text("name: linked\nsummary: s\nfiles:\n  - {path: /etc/x, source: x}\n")
    (scratch_tree / "layers" / "linked").symlink_to(outside)
    refused(nodeforge(scratch_tree, "validate"), "layers/linked:", "expected a layer directory, found a symbolic link")


def test_the_layers_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "images").mkdir(parents=True)
    (tree / "layers").symlink_to(ROOT / "layers")
    refused(nodeforge(tree, "validate"), "layers:", "expected a directory layers/, found a symbolic link")


@pytest.mark.parametrize("kind", ["images", "configs"])
def test_a_definition_file_linked_from_outside_the_tree_is_refused(
        scratch_tree: Path, tmp_path_factory: pytest.TempPathFactory, kind: str) -> None:
    outside = tmp_path_factory.mktemp("outside") / "outside.yaml"  # scratch_tree is tmp_path itself
    name = "node-minimal" if kind == "images" else "default"
    outside.write_text((ROOT / kind / f"{name}.yaml").read_text().replace(f"name: {name}\n", "name: outside\n"))
    (scratch_tree / kind / "outside.yaml").symlink_to(outside)
    refused(nodeforge(scratch_tree, "validate"), f"{kind}/outside.yaml:",
            "expected a definition file inside the project tree", "outside it")


def test_links_inside_the_tree_stay_allowed(scratch_tree: Path) -> None:
    d = layer(scratch_tree, "inner", "files:\n  - {path: /etc/inner, source: sub/link}\n")
    (d / "files" / "sub").mkdir(parents=True)
    (d / "files" / "real").write_text("inner\n")
    (d / "files" / "sub" / "link").symlink_to("../real")
    image(scratch_tree, "inner", "base, inner")
    proc = nodeforge(scratch_tree, "plan", "inner")
    assert proc.returncode == 0, proc.stderr


# --- 6. control characters once decoded ------------------------------------------------------------

@pytest.mark.parametrize("value", ['"a\\nb"', '"\\x1b[2J"', '["quiet", "\\u2028"]', "{a: \"\\x07\"}"])
def test_a_set_value_that_decodes_to_a_control_character_is_refused(value: str) -> None:
    with pytest.raises(NodeforgeError, match=r"--set kernel-args.extra: a value cannot hold control character"):
        parse_sets([f"kernel-args.extra={value}"])


def test_a_terminal_escape_never_reaches_plan_explain() -> None:
    proc = nodeforge(ROOT, "plan", "node-minimal", "--explain", "--set", 'sysctl.swappiness="\\x1b[2J"')
    refused(proc, "U+001B")
    assert "\x1b" not in proc.stdout + proc.stderr


# --- 12. reserved parameter names ------------------------------------------------------------------

def test_a_parameter_named_like_a_template_global_is_refused(scratch_tree: Path) -> None:
    layer(scratch_tree, "shadow", "params:\n  image: {type: str, default: x, doc: d}\n"
                                  "  range: {type: int, default: 1, doc: d}\n")
    refused(nodeforge(scratch_tree, "validate"), "layers/shadow/layer.yaml:4: params.image:",
            "the parameter name 'image' is reserved", "the image being composed",
            "layers/shadow/layer.yaml:5: params.range:", "rename the parameter (e.g. shadow_range)")


def test_reserved_names_cover_the_template_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name the composer puts beside a layer's parameters, and every template global, is reserved."""
    seen: list[set[str]] = []
    real = image_mod.check_asserts

    def spy(layer: Any, ctx: dict[str, Any], out: Any, settings: Any = None) -> None:
        seen.append(set(ctx) - set(layer.params))
        real(layer, ctx, out, settings)

    monkeypatch.setattr(image_mod, "check_asserts", spy)
    compose(load_tree(ROOT), "gpu-node", "dgx-h100", [])
    assert seen and set.union(*seen) <= set(RESERVED_PARAMS)
    assert set(render.GLOBALS) <= set(RESERVED_PARAMS)


def test_the_firmware_image_to_flash_is_a_parameter_again() -> None:
    """firmware.image rendered as the image's dict; renamed flash_image, it reaches the update's config."""
    plan = compose(load_tree(ROOT), "gpu-node", "default", parse_sets(["firmware.flash_image=fw-cx7.bin"]))
    conf = next(f for s in plan.steps for f in s.files if f.path == "/etc/nodeforge/firmware-update.conf")
    assert conf.content is not None and "\nIMAGE=fw-cx7.bin\n" in conf.content
    assert "firmware.flash_image" in plan.params and "firmware.image" not in plan.params


# --- low: rendered text, unused --set, the config at fault, one path one writer --------------------

def test_jinja_literals_cannot_bring_control_characters_back(scratch_tree: Path) -> None:
    layer(scratch_tree, "lit", "asserts:\n"
          "  - {name: never, that: \"{{ false }}\", message: 'bad {{ \"\\x1b[2J\" }}', remedy: fix}\n"
          "tests:\n  - name: 'a {{ \"\\n\" }} b'\n    file: {path: /etc/hostname}\n")
    image(scratch_tree, "lit", "base, lit")
    proc = nodeforge(scratch_tree, "plan", "lit")
    refused(proc, "layers/lit/layer.yaml:4: asserts[0].message:", "U+001B", "[rendered/grammar]",
            "layers/lit/layer.yaml:6: tests[0].name:", "U+000A")
    assert "\x1b" not in proc.stderr


def test_an_env_value_a_dockerfile_cannot_hold_is_a_definition_error_not_a_traceback(
        scratch_tree: Path, tmp_path: Path) -> None:
    """quoting.Unquotable escaped from `render` (and build) as a traceback."""
    layer(scratch_tree, "envs", "params:\n  v: {type: str, default: a, doc: d}\n"
          "env: {GOOD: '{{ v }}', BAD: '{{ \"a\\nb\" }}'}\nlabels: {org.example.x: '{{ \"\\x1b\" }}'}\n")
    image(scratch_tree, "envs", "base, envs", extra="env: {IMG: '{{ \"\\x07\" }}'}\n")
    out = tmp_path / "ctx"
    refused(nodeforge(scratch_tree, "render", "envs", str(out)),
            "layers/envs/layer.yaml:5: env.BAD:", "'a\\nb'", "layers/envs/layer.yaml:6: labels.org.example.x:",
            "images/envs.yaml:7: env.IMG:")
    assert not out.exists()


def test_a_set_for_a_layer_the_image_does_not_use_is_an_error() -> None:
    refused(nodeforge(ROOT, "plan", "node-minimal", "--set", "nvidia-driver.fabricmanager_version=1"),
            "command line: --set nvidia-driver.fabricmanager_version: image node-minimal does not use layer "
            "'nvidia-driver'", "layers of node-minimal (with its parents): base, kernel, sysctl")
    refused(nodeforge(ROOT, "plan", "node-minimal", "--set", "sysctls.swappiness=1"), "did you mean sysctl?")
    refused(nodeforge(ROOT, "plan", "cuda-11.8-devel", "--set", "kernel-args.extra=[quiet]"),
            "layers of cuda-11.8-devel (with its parents): base, cuda-base")


def test_a_set_meant_for_a_child_image_is_accepted_by_its_parents() -> None:
    """A build composes an image's parents with the image's own --set values."""
    tree = load_tree(ROOT)
    sets = parse_sets(["cuda-devel.source=apt"])
    compose(tree, "cuda-11.8-devel", "default", sets)
    compose(tree, "cuda-11.8-base", "default", sets)


def test_a_layer_a_config_adds_wrongly_is_reported_at_the_config(scratch_tree: Path) -> None:
    (scratch_tree / "configs" / "wrong.yaml").write_text("name: wrong\nsummary: s\nlayers:\n  node: [cuda-base]\n")
    proc = nodeforge(scratch_tree, "plan", "node-minimal", "-c", "wrong")
    refused(proc, "configs/wrong.yaml:4: layers.node[0]: layer 'cuda-base' applies to container, not a node image")
    assert "images/node-minimal.yaml" not in proc.stderr


def test_a_config_value_out_of_bounds_names_the_config(scratch_tree: Path) -> None:
    (scratch_tree / "configs" / "high.yaml").write_text(
        "name: high\nsummary: s\nparams:\n  sysctl: {swappiness: 900}\n")
    proc = nodeforge(scratch_tree, "plan", "node-minimal", "-c", "high")
    refused(proc, "configs/high.yaml:4: sysctl.swappiness: expected a value <= 200, found 900")
    assert "images/" not in proc.stderr


def test_two_layers_writing_one_path_with_the_same_content_conflict(scratch_tree: Path) -> None:
    for name in ("one", "two"):
        layer(scratch_tree, name, "files:\n  - {path: /etc/same.conf, content: \"x = 1\\n\"}\n")
    image(scratch_tree, "same", "base, one, two")
    refused(nodeforge(scratch_tree, "plan", "same"), "layers/two/layer.yaml:4: files./etc/same.conf:",
            "both write /etc/same.conf", "drop it from layer one or from layer two", "[conflict/files]")


def test_no_project_image_writes_one_path_twice() -> None:
    proc = nodeforge(ROOT, "validate")
    assert proc.returncode == 0, proc.stderr
