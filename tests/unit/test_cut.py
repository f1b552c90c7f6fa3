"""A cut image (a layer with `cut`, layers/distroless): the rules compose enforces, each with its
named check, and what the plan and the engine step look like (the image's whole environment on
an empty base, its tests its own). Engine-free: the build itself is tested in tests/test_cuda.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.compose import compose
from builder.definitions.load import load_tree
from builder.engine.dockerfile import step_dockerfile
from builder.errors import DefinitionError

KEYS_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "keys-tree"

CUT = """\
name: cutter
summary: keeps /kept alone
applies-to: [container]
cut: /kept
env: {CUTTER: "1"}
steps:
  - name: assemble
    run: mkdir -p /kept
tests:
{tests}
"""
IMAGE_TEST = """\
  - name: no shell
    file: {path: /bin/sh, exists: false}
"""
IMAGE = """\
name: {name}
summary: a test image
kind: container
version: "1"
from: {base}
layers: [{layers}]
"""


def _tree(tmp: Path, images: dict[str, tuple[str, str]], tests: str = IMAGE_TEST) -> Path:
    root = tmp / "tree"
    shutil.copytree(KEYS_TREE, root)
    (root / "layers" / "cutter").mkdir()
    (root / "layers" / "cutter" / "layer.yaml").write_text(CUT.replace("{tests}", tests))
    for name, (base, layers) in images.items():
        (root / "images" / f"{name}.yaml").write_text(IMAGE.format(name=name, base=base, layers=layers))
    return root


def _problems(root: Path, image: str) -> list[str]:
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), image)
    return [p.lint for p in e.value.problems]


FULL = "{image: container-base}"


def test_a_cut_image_carries_the_whole_environment_and_only_its_own_tests(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"cut": (FULL, "cutter")})
    tree = load_tree(root)
    full, plan = compose(tree, "container-base"), compose(tree, "cut")
    (step,) = plan.steps
    assert dict(step.env) == {**{k: v.value for k, v in full.env.items()}, "CUTTER": "1"}
    assert [t.name for t in plan.tests] == ["no shell"]  # the full image's tests ran on the full image
    assert full.tests and not {t.name for t in full.tests} & {t.name for t in plan.tests}
    text = step_dockerfile(step, "parent:ref")
    assert text.startswith("FROM parent:ref AS nodeforge-full\n")
    after = text.split("FROM scratch\n", 1)[1]
    assert after.startswith('COPY --from=nodeforge-full ["/kept/", "/"]\n') and "ENV " in after


def test_the_environment_is_part_of_the_key(tmp_path: Path) -> None:
    a = compose(load_tree(_tree(tmp_path / "a", {"cut": (FULL, "cutter")})), "cut")
    root = _tree(tmp_path / "b", {"cut": (FULL, "cutter")})
    layer = root / "layers" / "cutter" / "layer.yaml"
    layer.write_text(layer.read_text().replace('CUTTER: "1"', 'CUTTER: "2"'))
    assert compose(load_tree(root), "cut").key != a.key


def test_the_cut_layer_is_the_only_layer(tmp_path: Path) -> None:
    first = next(iter(sorted(load_tree(KEYS_TREE).layers)))
    assert "cut/only-layer" in _problems(_tree(tmp_path, {"cut": (FULL, f"{first}, cutter")}), "cut")


def test_only_a_container_built_from_an_image_is_cut(tmp_path: Path) -> None:
    debian = "{debian: {suite: bookworm}}\nsource-date-epoch: 1700000000"
    assert "cut/container" in _problems(_tree(tmp_path, {"cut": (debian, "cutter")}), "cut")


def test_no_image_builds_on_a_cut_image(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"cut": (FULL, "cutter"), "child": ("{image: cut}", "")})
    assert "cut/no-children" in _problems(root, "child")


def test_a_cut_image_has_no_test_that_needs_a_shell(tmp_path: Path) -> None:
    shell = "  - name: needs a shell\n    command: {run: 'true'}\n"
    assert "cut/no-shell" in _problems(_tree(tmp_path, {"cut": (FULL, "cutter")}, IMAGE_TEST + shell), "cut")
