"""A node image built `from:` a node image: it keeps every kernel argument of its parent (a repeated
one such as console= too, in order), so every derived boot check holds; and a child whose own steps
add nothing to the initramfs reuses its parent's instead of generating one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.compose import compose
from builder.definitions.load import load_tree
from builder.engine import initramfs
from builder.plan import BuildPlan

CHILD = """\
name: child-node
summary: node-minimal and nothing of its own
kind: node
version: "0.1.0"
from: {image: node-minimal}
layers: []
outputs: {tags: ["nodeforge-test/child-node:0.1.0"], formats: [raw]}
"""

SYSCTL_LAYER = """\
name: child-sysctl
summary: one sysctl value of the child's own
applies-to: [node]
requires: [base]
sysctl:
  vm.max_map_count: 262144
"""


def _child(tree_root: Path, layers: str = "[]") -> None:
    (tree_root / "images" / "child-node.yaml").write_text(CHILD.replace("layers: []", f"layers: {layers}"))


def _ikey(child: BuildPlan, parent: BuildPlan) -> str:
    return initramfs.inputs_key(child, initramfs.Parent(initramfs.inputs_key(parent), parent.base.epoch))


def test_a_child_keeps_every_repeated_kernel_argument_of_its_parent_in_order(scratch_tree: Path) -> None:
    _child(scratch_tree)
    tree = load_tree(scratch_tree)
    parent, child = compose(tree, "node-minimal"), compose(tree, "child-node")
    consoles = [a for a in parent.cmdline.split() if a.startswith("console=")]
    assert len(consoles) >= 2  # console=tty0 console=ttyS0,115200n8
    assert child.cmdline == parent.cmdline
    assert [a for a in child.cmdline.split() if a.startswith("console=")] == consoles
    # every command-line boot check (the parent's derived ones are the child's too) holds on it
    args = set(child.cmdline.split())
    checks = [t for t in child.tests if t.kind == "cmdline"]
    assert {a for t in checks for a in t.spec.get("contains", [])} >= set(consoles)
    for t in checks:
        assert set(t.spec.get("contains", [])) <= args, t.name


def test_a_child_with_nothing_of_its_own_has_its_parent_s_initramfs_key(scratch_tree: Path) -> None:
    _child(scratch_tree)
    tree = load_tree(scratch_tree)
    parent, child = compose(tree, "node-minimal"), compose(tree, "child-node")
    assert _ikey(child, parent) == initramfs.inputs_key(parent)
    # an edit of the parent that leaves its initramfs alone (a sysctl value) leaves the child's too
    layer = scratch_tree / "layers" / "sysctl" / "layer.yaml"
    text = layer.read_text()
    assert "default: 10, min: 1" in text
    layer.write_text(text.replace("default: 10, min: 1", "default: 11, min: 1", 1))
    edited = load_tree(scratch_tree)
    parent2, child2 = compose(edited, "node-minimal"), compose(edited, "child-node")
    assert parent2.key != parent.key and child2.key != child.key
    assert _ikey(child2, parent2) == _ikey(child, parent) == initramfs.inputs_key(parent)


def test_a_child_layer_without_initramfs_inputs_reuses_and_a_modprobe_option_does_not(
        scratch_tree: Path) -> None:
    (scratch_tree / "layers" / "child-sysctl").mkdir()
    (scratch_tree / "layers" / "child-sysctl" / "layer.yaml").write_text(SYSCTL_LAYER)
    _child(scratch_tree, "[child-sysctl]")
    tree = load_tree(scratch_tree)
    parent, child = compose(tree, "node-minimal"), compose(tree, "child-node")
    assert _ikey(child, parent) == initramfs.inputs_key(parent)
    (scratch_tree / "layers" / "child-sysctl" / "layer.yaml").write_text(
        SYSCTL_LAYER + "kernel:\n  modprobe:\n    nvme:\n      poll_queues: 4\n")
    tree = load_tree(scratch_tree)
    assert _ikey(compose(tree, "child-node"), parent) != initramfs.inputs_key(parent)


@pytest.mark.docker
def test_a_child_node_image_boots_with_every_boot_check_passing(scratch_tree: Path, tmp_path: Path,
                                                               docker_client: object) -> None:
    """Built (node-minimal's steps come from the engine's cache by key) and booted: every check of
    the plan, the parent's derived console= checks among them, passes; the child's initramfs is its
    parent's (not generated again, not copied in again)."""
    from builder.pipeline import Builder
    from builder.progress import Progress
    from builder.verify.run import run_tests

    _child(scratch_tree)
    tree = load_tree(scratch_tree)
    parent, child = Builder(tree, None, [], Progress(), formats=["raw"]).build(["child-node"])
    assert child.initramfs is not None and parent.initramfs is not None
    # the parent's initramfs, in the parent's layers: no step (and no second copy of it) in the child
    assert child.initramfs.key == parent.initramfs.key and child.initramfs.status == "inherited"
    rc = run_tests(child.plan, tmp_path / "reports", boot=True, tree=tree, boot_modes=("direct",))
    data = json.loads((tmp_path / "reports" / "child-node.json").read_text())
    boot = [r for r in data["results"] if r["scope"] == "boot" or r["kind"] == "verdict"]
    failed = [f"{r['layer']}: {r['name']}: {r['message']}" for r in boot if r["status"] != "passed"]
    assert not failed and rc == 0, failed
    cmdline = [r for r in data["results"] if r["kind"] == "cmdline"]
    assert any(r["layer"] == "kernel" for r in cmdline)  # the parent's console= check, on the child
    assert all(r["status"] == "passed" for r in cmdline)
