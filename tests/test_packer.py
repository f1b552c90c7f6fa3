"""`nodeforge export packer`: the template validates with Debian's packer, and a real Packer build
(qemu builder, software emulation) of a small node image produces a disk that passes the same
boot-scope checks as nodeforge's own."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from builder.compose import compose
from builder.definitions.load import load_tree
from builder.node import assemble
from builder.verify import boot

SMALL_NODE = textwrap.dedent("""\
    name: small-node
    summary: A small node image for the Packer round trip
    kind: node
    version: "1"
    from:
      debian:
        suite: bookworm
        components: [main, contrib, non-free, non-free-firmware]
    source-date-epoch: 1735689600
    layers: [base, kernel, sysctl]
    outputs:
      tags: [nodeforge-test/small-node:1]
    """)


@pytest.fixture(scope="module")
def exported(docker_client: docker.DockerClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    from builder.export.packer import export

    root = tmp_path_factory.mktemp("packer-tree")
    here = Path(__file__).resolve().parent.parent
    for d in ("layers", "configs"):
        shutil.copytree(here / d, root / d)
    (root / "images").mkdir()
    (root / "images" / "small-node.yaml").write_text(SMALL_NODE)
    tree = load_tree(root)
    path = export(tree, "small-node", "default", [], root / "build" / "packer")
    yield root, path
    shutil.rmtree(root, ignore_errors=True)  # the base disk and what the module's builds wrote


def test_template_applies_the_layers_after_the_kernel(exported: tuple[Path, Path]) -> None:
    _root, path = exported
    t = json.loads(path.read_text())
    (builder,) = t["builders"]
    assert builder["type"] == "qemu" and builder["disk_image"] is True
    assert (path.parent / t["variables"]["base_disk"]).is_file()
    text = json.dumps(t["provisioners"])
    assert "applying layer sysctl" in text and "layers/03-sysctl/" in text
    assert "applying layer kernel" not in text, "layers in the base disk must not be applied again"
    assert (path.parent / "layers" / "03-sysctl" / "root" / "etc" / "sysctl.d").is_dir()
    assert "update-initramfs" in text and "authorized_keys" in text


@pytest.mark.slow
def test_packer_build_makes_a_disk_that_passes_the_boot_checks(exported: tuple[Path, Path]) -> None:
    import packerpy

    root, path = exported
    out_dir = path.parent / "output-small-node"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    packer = packerpy.PackerExecutable(executable_path=shutil.which("packer"))
    cwd = Path.cwd()
    try:
        os.chdir(path.parent)
        rc, out, err = packer.build(path.name, color="false")
    finally:
        os.chdir(cwd)
    text = (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")
    assert rc == 0, text[-3000:]
    assert "nodeforge: applied layer sysctl" in text and "nodeforge: finished" in text
    disk = out_dir / "small-node.qcow2"
    assert disk.is_file()

    # boot Packer's disk through its own boot loader, with the checks nodeforge runs on its disks
    tree = load_tree(root)
    plan = compose(tree, "small-node", "default")
    tests = [t for t in plan.tests if t.scope == "boot" and t.layer in ("sysctl", "kernel")]
    base = assemble.load(root, "small-node-packer-base")
    assert base is not None
    # Packer's disk, booted through its own boot loader; the base's kernel only finds the accelerator
    art = dataclasses.replace(base, image="small-node", dir=str(out_dir),
                              files={"qcow2": disk.name, "kernel": str(base.path("kernel"))})
    o = boot.boot(art, "bios", root / "packer-boot.log", tests=tests)
    failed = [(t.name, boot.guest.judge(t, *o.report.probes[i])) for i, t in enumerate(tests)
              if i in o.report.probes and boot.guest.judge(t, *o.report.probes[i])]
    assert o.verdict == "passed", (o.reason, o.tail())
    assert len(o.report.probes) == len(tests) and not failed, failed
