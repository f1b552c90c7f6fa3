"""tools/lint_scripts.py (`make lint`): every inline step and command-test script, rendered with the
layers' defaults, goes through shellcheck; a finding names the layer's file and line, the step or test
and the line of the script. A deliberately bad script fails it; the project's layers all render."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.trees import NODE_IMAGE

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "lint_scripts.py"

pytestmark = pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")

IMAGE = NODE_IMAGE.replace("LAYERS", "good")
GOOD = """name: good
summary: a layer whose scripts are clean
params:
  dir: {type: str, default: /srv/data dir, doc: a directory (with a space; the step quotes it)}
steps:
  - name: make the directory
    run: |
      mkdir -p {{ dir }}
      chmod 0755 {{ dir }}
tests:
  - name: the directory exists
    command: {run: "test -d {{ dir }}"}
"""
BAD = """name: bad
summary: a layer whose step and test shellcheck refuses
applies-to: [node]
steps:
  - name: count the files
    run: |
      n=0
      for f in $(ls /etc); do n=$((n + 1)); done
      d=$(pwd)
      ls $d
tests:
  - name: a sloppy test
    scope: boot
    command:
      run: |
        cd /tmp
        [ $HOME == /root ]
"""
LONG = """name: long
summary: a layer with an inline script of twelve lines
applies-to: [node]
steps:
  - name: twelve lines
    run: |
      {% if true %}
      echo 1
      echo 2
      echo 3
      echo 4
      echo 5
      echo 6
      echo 7
      echo 8
      echo 9
      echo 10
      {% endif %}
      echo 11
"""


def tree(root: Path, **layers: str) -> Path:
    for text in (GOOD, *layers.values()):
        name = text.split("\n", 1)[0].removeprefix("name: ")
        (root / "layers" / name).mkdir(parents=True)
        (root / "layers" / name / "layer.yaml").write_text(text)
    (root / "images").mkdir()
    (root / "images" / "img.yaml").write_text(IMAGE)
    (root / "configs").mkdir()
    return root


def lint(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), "--root", str(root), *args], capture_output=True, text=True,
                          timeout=120)


def test_clean_scripts_pass(tmp_path: Path) -> None:
    proc = lint(tree(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: 2 inline scripts" in proc.stdout


def test_a_bad_step_and_test_fail_naming_layer_step_test_and_line(tmp_path: Path) -> None:
    proc = lint(tree(tmp_path, bad=BAD))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    step = [line for line in lines if "step 'count the files'" in line]
    test = [line for line in lines if "test 'a sloppy test'" in line]
    # the step's `run: |` is at line 6: its script's line 2 is the definition's line 8
    assert any(line.startswith("layers/bad/layer.yaml:8: layer bad step 'count the files' (line 2 of its script)")
               and "SC2045" in line for line in step), lines
    assert any("(line 4 of its script)" in line and "SC2086" in line for line in step), lines
    assert any("SC2164" in line and "(line 1 of its script)" in line for line in test), lines
    assert not [line for line in lines if "layer good" in line], "the clean layer has no finding"


def test_an_inline_script_over_the_limit_is_reported_template_lines_not_counted(tmp_path: Path) -> None:
    root = tree(tmp_path, long=LONG)
    assert lint(root).returncode == 0
    proc = lint(root, "--max-lines", "10")
    assert proc.returncode == 1
    assert "layer long step 'twelve lines'" in proc.stdout and "has 11 lines (more than 10)" in proc.stdout
    assert lint(root, "--max-lines", "11").returncode == 0


def test_an_unknown_layer_or_a_broken_tree_is_exit_2(tmp_path: Path) -> None:
    root = tree(tmp_path)
    proc = lint(root, "nothing")
    assert proc.returncode == 2 and "no layer named nothing" in proc.stderr
    (root / "layers" / "good" / "layer.yaml").write_text("name: good\nsummary: [not, text]\n")
    proc = lint(root)
    assert proc.returncode == 2 and "layers/good/layer.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_every_layer_of_the_project_renders() -> None:
    """Every layer composes alone into a probe image (exit 0 or 1 on findings, never 2), and every
    layer's inline scripts are read: none is left out."""
    proc = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "not rendered" not in proc.stderr and "Traceback" not in proc.stderr
