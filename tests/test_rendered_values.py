"""Values that templates render obey the grammar of where they are written, like literal ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYER = """\
name: bad
summary: a layer whose parameters render into paths, module names and module options
applies-to: [node]
requires: [base]
params:
  where: {{type: str, default: "/etc/x.conf", doc: a file path}}
  module: {{type: str, default: "nouveau", doc: a module name}}
  option: {{type: str, default: "1", doc: a module option value}}
files:
  - {{path: "{{{{ where }}}}", content: "x\\n"}}
kernel:
  blacklist: ["{{{{ module }}}}"]
  modprobe: {{nvidia-current: {{NVreg_X: "{{{{ option }}}}"}}}}
"""


def plan(tree: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), "plan", "bad-node", *args],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.fixture
def tree(scratch_tree: Path) -> Path:
    (scratch_tree / "layers/bad").mkdir()
    (scratch_tree / "layers/bad/layer.yaml").write_text(LAYER.format())
    img = (scratch_tree / "images/node-minimal.yaml").read_text()
    img = img.replace("name: node-minimal", "name: bad-node").replace("  - monitoring\n", "  - monitoring\n  - bad\n")
    (scratch_tree / "images/bad-node.yaml").write_text(img.replace("nodeforge/node-minimal", "nodeforge/bad-node"))
    return scratch_tree


def test_good_values_plan(tree: Path) -> None:
    proc = plan(tree, "bad.where=/etc/./y//z.conf")
    assert proc.returncode == 0, proc.stderr
    assert "/etc/y/z.conf" in proc.stdout


@pytest.mark.parametrize(("setting", "key"), [
    ("bad.where=/etc/../../root/x", "files[0].path"),
    ("bad.where=/", "files[0].path"),
    ("bad.module=nouveau;reboot", "kernel.blacklist[0]"),
    ("bad.option=1 install x /bin/sh", "kernel.modprobe.nvidia-current.NVreg_X"),
])
def test_rendered_value_outside_its_grammar_is_refused(tree: Path, setting: str, key: str) -> None:
    proc = plan(tree, setting)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert key in proc.stderr and "layers/bad/layer.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["/etc/x\nRUN id", "/etc/x\x1b[2J", "/etc/x\rmore"])
def test_a_control_character_on_the_command_line_is_refused(tree: Path, value: str) -> None:
    proc = plan(tree, f"bad.where={value}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--set bad.where" in proc.stderr and "control character" in proc.stderr and "Traceback" not in proc.stderr


def test_an_alias_bomb_on_the_command_line_is_never_expanded() -> None:
    from builder.compose.params import parse_sets

    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = "{" + ", ".join(levels) + "}"
    ((_, _, value),) = parse_sets([f"kernel-args.extra={bomb}"])
    assert value == bomb  # refused by the bounded reader: kept as the literal text, which no grammar accepts
