"""Every malformed definition under tests/malformed/ gives exit 2 and a message naming the file,
the line and the key; never a traceback; nothing half-written."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli import main

CASES = sorted(p for p in (Path(__file__).parent / "malformed").iterdir() if p.is_dir())
FROZEN = Path(__file__).parent / "fixtures" / "keys-tree"


@pytest.fixture
def base_tree(tmp_path: Path) -> Path:
    """The frozen definitions (tests/fixtures/keys-tree) the cases break: a valid tree that does
    not change while layers are added to the project's own."""
    shutil.copytree(FROZEN, tmp_path / "tree")
    return tmp_path / "tree"


def overlay(case: Path, tree: Path) -> None:
    for f in case.rglob("*"):
        if f.is_file() and f.name != "expect.txt":
            dest = tree / f.relative_to(case)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)


def snapshot(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*")}


def nodeforge(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line, in process (a subprocess per case made this file the slowest engine-free
    one); an exception other than the tool's own errors propagates and fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--root", str(tree), *args])
        except SystemExit as e:  # argparse's usage errors
            code = int(e.code or 0)
    return subprocess.CompletedProcess(["nodeforge", *args], code, out.getvalue(), err.getvalue())


def test_a_malformed_tree_exits_2_without_a_traceback_from_the_command(base_tree: Path) -> None:
    overlay(CASES[0], base_tree)
    proc = subprocess.run([sys.executable, "-m", "builder", "--root", str(base_tree), "validate"],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


@pytest.mark.slow  # the corpus, case by case: about a second each (make test-fast leaves it out)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_definition_is_reported(case: Path, base_tree: Path) -> None:
    overlay(case, base_tree)
    before = snapshot(base_tree)
    proc = nodeforge(base_tree, "validate")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for expected in (case / "expect.txt").read_text().splitlines():
        assert expected in proc.stderr, f"{expected!r} not in:\n{proc.stderr}"
    assert snapshot(base_tree) == before


@pytest.mark.parametrize("case", ["karg-iommu-conflict", "image-unknown-param", "template-undefined"])
def test_render_of_a_malformed_image_writes_nothing(case: str, base_tree: Path, tmp_path: Path) -> None:
    overlay(Path(__file__).parent / "malformed" / case, base_tree)
    out = tmp_path / "ctx"
    proc = nodeforge(base_tree, "render", "bad", str(out))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name("ctx.tmp").exists()


def test_unknown_set_parameter_names_the_flag(base_tree: Path) -> None:
    proc = nodeforge(base_tree, "plan", "node-minimal", "--set", "sysctl.swapiness=3")
    assert proc.returncode == 2
    assert "command line" in proc.stderr and "sysctl.swapiness" in proc.stderr
    assert "no parameter 'swapiness'" in proc.stderr


def test_set_value_out_of_range(base_tree: Path) -> None:
    proc = nodeforge(base_tree, "plan", "node-minimal", "--set", "sysctl.swappiness=900")
    assert proc.returncode == 2 and "expected a value <= 200, found 900" in proc.stderr


def test_malformed_set_syntax(base_tree: Path) -> None:
    proc = nodeforge(base_tree, "plan", "node-minimal", "--set", "swappiness")
    assert proc.returncode == 2 and "LAYER.PARAM=VALUE" in proc.stderr


def test_mistyped_names_say_did_you_mean(base_tree: Path) -> None:
    param = nodeforge(base_tree, "plan", "node-minimal", "--set", "sysctl.swapiness=3")
    assert param.returncode == 2 and "did you mean swappiness?" in param.stderr
    image = nodeforge(base_tree, "plan", "node-minimall")
    assert image.returncode == 2 and "did you mean node-minimal?" in image.stderr
