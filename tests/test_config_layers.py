"""A config adds site layers to the images built with it; a layer's asserts guard its parameter values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builder.compose import compose
from builder.definitions.load import load_tree
from builder.errors import DefinitionError

ROOT = Path(__file__).resolve().parent.parent


def write(tree: Path, rel: str, text: str) -> None:
    p = tree / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


SITE_LAYER = """\
name: site-extra
summary: a site's own layer
applies-to: [node]
requires: [base]
params:
  driver: {type: str, default: "535.247.01", doc: driver version}
  companion: {type: str, default: "535.247.01", doc: a package that must match the driver exactly}
asserts:
  - name: companion-matches-driver
    that: "{{ companion == driver }}"
    message: "companion {{ companion }} must equal the driver {{ driver }}"
    remedy: "set site-extra.companion to {{ driver }}"
files:
  - {path: /etc/site-extra, content: "driver {{ driver }}\\n"}
"""


def test_config_layers_join_node_images_only(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/site-extra/layer.yaml", SITE_LAYER)
    write(scratch_tree, "configs/site.yaml", "name: site\nsummary: s\nlayers:\n  node: [site-extra]\n")
    tree = load_tree(scratch_tree)
    node = compose(tree, "node-minimal", "site")
    assert [s.layer for s in node.steps][-1] == "site-extra"
    assert "/etc/site-extra" in node.files
    plain = compose(tree, "node-minimal", None)
    assert "site-extra" not in [s.layer for s in plain.steps]
    container = compose(tree, "container-base", "site")
    assert "site-extra" not in [s.layer for s in container.steps]


def test_config_with_an_unknown_layer_is_a_definition_error(scratch_tree: Path) -> None:
    write(scratch_tree, "configs/site.yaml", "name: site\nsummary: s\nlayers:\n  node: [base, no-such]\n")
    with pytest.raises(DefinitionError) as e:
        load_tree(scratch_tree)
    (problem,) = e.value.problems
    assert problem.file == "configs/site.yaml" and problem.line == 4 and "no-such" in problem.message


def test_assert_names_both_values_and_exits_2(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/site-extra/layer.yaml", SITE_LAYER)
    write(scratch_tree, "configs/site.yaml",
          "name: site\nsummary: s\nlayers:\n  node: [site-extra]\nparams:\n  site-extra: {companion: '535.183.01'}\n")
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "--root", str(scratch_tree), "plan", "node-minimal",
                           "-c", "site"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "companion 535.183.01 must equal the driver 535.247.01" in proc.stderr
    assert "layers/site-extra/layer.yaml" in proc.stderr and "asserts.companion-matches-driver" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "builder.cli", "--root", str(scratch_tree), "plan", "node-minimal",
                         "-c", "site", "--set", "site-extra.companion=535.247.01"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
