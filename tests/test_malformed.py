"""Every malformed definition under tests/malformed/ gives exit 2 and a message naming the file,
the line and the key; never a traceback; nothing half-written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CASES = sorted(p for p in (Path(__file__).parent / "malformed").iterdir() if p.is_dir())


def overlay(case: Path, tree: Path) -> None:
    for f in case.rglob("*"):
        if f.is_file() and f.name != "expect.txt":
            dest = tree / f.relative_to(case)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)


def snapshot(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*")}


def nodeforge(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), *args],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_definition_is_reported(case: Path, scratch_tree: Path) -> None:
    overlay(case, scratch_tree)
    before = snapshot(scratch_tree)
    proc = nodeforge(scratch_tree, "validate")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for expected in (case / "expect.txt").read_text().splitlines():
        assert expected in proc.stderr, f"{expected!r} not in:\n{proc.stderr}"
    assert snapshot(scratch_tree) == before


@pytest.mark.parametrize("case", ["karg-iommu-conflict", "image-unknown-param", "template-undefined"])
def test_render_of_a_malformed_image_writes_nothing(case: str, scratch_tree: Path, tmp_path: Path) -> None:
    overlay(Path(__file__).parent / "malformed" / case, scratch_tree)
    out = tmp_path / "ctx"
    proc = nodeforge(scratch_tree, "render", "bad", str(out))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name("ctx.tmp").exists()


def test_unknown_set_parameter_names_the_flag(scratch_tree: Path) -> None:
    proc = nodeforge(scratch_tree, "plan", "node-minimal", "--set", "sysctl.swapiness=3")
    assert proc.returncode == 2
    assert "command line" in proc.stderr and "sysctl.swapiness" in proc.stderr
    assert "no parameter 'swapiness'" in proc.stderr


def test_set_value_out_of_range(scratch_tree: Path) -> None:
    proc = nodeforge(scratch_tree, "plan", "node-minimal", "--set", "sysctl.swappiness=900")
    assert proc.returncode == 2 and "expected a value <= 200, found 900" in proc.stderr


def test_malformed_set_syntax(scratch_tree: Path) -> None:
    proc = nodeforge(scratch_tree, "plan", "node-minimal", "--set", "swappiness")
    assert proc.returncode == 2 and "LAYER.PARAM=VALUE" in proc.stderr
