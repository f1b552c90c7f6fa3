"""What a composition problem says about where it comes from: a failed assert names the values its
condition reads and where each was set (the config's line, the --set); a file two layers write with
different contents shows the lines that differ; every problem names the image being composed, a
parent's problem the parent, once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError, Problem

KEYS_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "keys-tree"

CHECKED = """\
name: checked
summary: a layer with an assert on two parameters
params:
  timeout: {type: int, default: 10, doc: seconds a check may take}
  deadline: {type: int, default: 60, doc: seconds all checks may take}
asserts:
  - name: timeout-under-deadline
    that: "{{ timeout <= deadline }}"
    message: "timeout ({{ timeout }} s) is longer than the deadline ({{ deadline }} s)"
    remedy: lower checked.timeout or raise checked.deadline
"""

IMAGE = """\
name: {name}
summary: a test image
kind: container
version: "1"
from: {base}
source-date-epoch: 1700000000
layers: [{layers}]
"""


def _layer(tree: Path, name: str, text: str) -> None:
    (tree / "layers" / name).mkdir(parents=True)
    (tree / "layers" / name / "layer.yaml").write_text(text)


def _image(tree: Path, name: str, layers: str, base: str = "{debian: {suite: bookworm}}") -> None:
    (tree / "images" / f"{name}.yaml").write_text(IMAGE.format(name=name, base=base, layers=layers))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(KEYS_TREE, tmp_path / "tree")
    _layer(tmp_path / "tree", "checked", CHECKED)
    _image(tmp_path / "tree", "probe", "base, checked")
    return tmp_path / "tree"


def _problems(tree: Path, image: str, config: str | None = None, sets: list[str] | None = None) -> list[Problem]:
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(tree), image, config, parse_sets(sets or []))
    return e.value.problems


def test_a_failed_assert_names_the_set_value_and_the_default(tree: Path) -> None:
    (p,) = _problems(tree, "probe", sets=["checked.timeout=900"])
    assert (p.file, p.path, p.lint) == ("layers/checked/layer.yaml", "asserts.timeout-under-deadline",
                                        "assert/timeout-under-deadline")
    assert p.message.startswith("timeout (900 s) is longer than the deadline (60 s) (values: timeout = 900 "
                                "(--set checked.timeout); deadline = 60 (default (layers/checked/layer.yaml:5)))")


def test_a_failed_assert_names_the_config_line(tree: Path) -> None:
    (tree / "configs" / "slow.yaml").write_text("name: slow\nsummary: slow checks\nlayers:\n  container: [checked]\n"
                                                "params:\n  checked:\n    deadline: 5\n")
    (p,) = _problems(tree, "probe", "slow")
    assert "deadline = 5 (config slow (configs/slow.yaml:7))" in p.message, p.message
    assert "timeout = 10 (default (layers/checked/layer.yaml:4))" in p.message, p.message


def test_a_file_conflict_shows_the_line_that_differs(tree: Path) -> None:
    _layer(tree, "one", "name: one\nsummary: writes a\nfiles:\n"
                        "  - {path: /etc/a.conf, content: \"x = 1\\ny = 2\\n\"}\n")
    _layer(tree, "two", "name: two\nsummary: writes a\nfiles:\n"
                        "  - {path: /etc/a.conf, content: \"x = 1\\ny = 3\\n\"}\n")
    _image(tree, "clash", "base, one, two")
    (p,) = _problems(tree, "clash")
    assert (p.file, p.line, p.path, p.lint) == ("layers/two/layer.yaml", 4, "files./etc/a.conf", "conflict/files")
    assert "layer one (layers/one/layer.yaml:4) and layer two (layers/two/layer.yaml:4) write different contents " \
           "to /etc/a.conf: line 2: 'y = 2' -> 'y = 3'" in p.message, p.message
    assert p.remedy.startswith("write /etc/a.conf in one layer only: drop it from layer one or from layer two")


def test_every_problem_names_the_image_a_parent_s_once(tree: Path) -> None:
    (p,) = _problems(tree, "probe", sets=["checked.timeout=900"])
    assert p.message.endswith("(while composing image probe, images/probe.yaml)"), p.message
    _image(tree, "child", "app-user", base="{image: probe}")
    (inherited,) = _problems(tree, "child", sets=["checked.timeout=900"])
    assert inherited.message == p.message  # the parent's problem, named by the parent only
    assert inherited.message.count("while composing image") == 1


def test_a_problem_of_the_image_s_own_file_is_not_named_twice(tree: Path) -> None:
    _image(tree, "typo", "base, no-such-layer")
    problems = _problems(tree, "typo")
    assert problems and all(p.file == "images/typo.yaml" for p in problems)
    assert not any("while composing image" in p.message for p in problems)


def test_validate_names_the_image_and_exits_2(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builder.cli import main

    (tree / "layers" / "checked" / "layer.yaml").write_text(CHECKED.replace("default: 10", "default: 90"))
    assert main(["--root", str(tree), "validate"]) == 2
    err = capsys.readouterr().err
    assert "asserts.timeout-under-deadline" in err and "(while composing image probe, images/probe.yaml)" in err
