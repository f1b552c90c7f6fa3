"""Node images: the assembled disks and netboot artifacts, and boots under qemu (software
emulation here) in direct-kernel, UEFI and BIOS modes, with every boot-scope check reported from
the serial console. Broken images fail with their reason, not with a time-out."""

from __future__ import annotations

import hashlib
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from builder.errors import EnvironmentProblem
from builder.node import assemble, outputs
from builder.node.assemble import NodeArtifacts
from builder.pipeline import BuildResult
from builder.progress import Progress
from builder.verify import boot

BOOT_LAYERS = {"kernel", "sysctl", "kernel-args", "monitoring"}


def node_of(result: BuildResult) -> NodeArtifacts:
    assert result.node is not None, f"{result.image} is not a node image"
    return result.node


def _sfdisk(disk: Path) -> dict[str, Any]:
    out = subprocess.run(["sfdisk", "-J", str(disk)], capture_output=True, text=True, check=True).stdout
    table: dict[str, Any] = json.loads(out)["partitiontable"]
    return table


def test_node_image_gives_raw_qcow2_and_netboot_artifacts(built_node_minimal: BuildResult) -> None:
    art = node_of(built_node_minimal)
    assert art is not None
    # the default makes every format of the outputs table
    assert set(art.files) == {*outputs.KERNEL, *(role for o in outputs.OUTPUTS.values() for role in o.files)}
    assert set(art.files) == {"raw", "qcow2", "kernel", "initrd", "rootfs", "ipxe"}
    for role in art.files:
        assert art.path(role).stat().st_size > 0, role
    sums = dict(line.split("  ")[::-1] for line in (Path(art.dir) / "SHA256SUMS").read_text().splitlines())
    assert sums["boot.ipxe"] == hashlib.sha256(art.path("ipxe").read_bytes()).hexdigest()

    table = _sfdisk(art.path("raw"))
    assert table["label"] == "gpt"
    types = [p["type"] for p in table["partitions"]]
    assert types == [assemble.TYPE_BIOS, assemble.TYPE_ESP, assemble.TYPE_ROOT_X86_64]
    assert art.path("raw").stat().st_size == art.disk_mib * assemble.MIB

    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(art.path("qcow2"))],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "qcow2" and info["virtual-size"] == art.disk_mib * assemble.MIB

    ipxe = art.path("ipxe").read_text()
    assert ipxe.startswith("#!ipxe")
    for name in ("vmlinuz", "initrd.img", "rootfs.tar.gz", "boot=nodeforge-net", "module_blacklist=nouveau"):
        assert name in ipxe
    assert f"nodeforge.root_sha256={sums['rootfs.tar.gz']}" in ipxe


def test_disk_holds_boot_loaders_and_a_clean_root(built_node_minimal: BuildResult, tmp_path: Path) -> None:
    art = node_of(built_node_minimal)
    raw = art.path("raw")
    with raw.open("rb") as f:
        mbr = f.read(512)
    assert mbr[510:] == b"\x55\xaa" and any(mbr[:440]), "no BIOS boot code in the MBR"
    esp = f"{raw}@@{assemble.ESP_START_MIB * assemble.MIB}"
    listing = subprocess.run(["mdir", "-b", "-i", esp, "::/EFI/BOOT"], capture_output=True, text=True,
                             env={"MTOOLS_SKIP_CHECK": "1", "PATH": "/usr/bin:/bin"})
    assert "BOOTX64.EFI" in listing.stdout.upper(), listing.stderr

    root = f"{raw}?offset={assemble.ROOT_START_MIB * assemble.MIB}"

    def cat(path: str) -> str:
        p = subprocess.run(["debugfs", "-R", f"cat {path}", root], capture_output=True, text=True)
        return p.stdout

    assert f"LABEL={art.root_label}" in cat("/etc/fstab")
    assert cat("/etc/machine-id") == "", "a machine-id is baked into the image"
    stat = subprocess.run(["debugfs", "-R", "stat /etc/hostname", root], capture_output=True, text=True)
    assert "File not found" in stat.stderr + stat.stdout
    label = subprocess.run(["blkid", "-p", "-O", str(assemble.ROOT_START_MIB * assemble.MIB), "-s", "LABEL",
                            "-o", "value", str(raw)], capture_output=True, text=True).stdout.strip()
    assert label == art.root_label


def test_unchanged_node_image_is_not_reassembled(built_node_minimal: BuildResult) -> None:
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder

    lines: list[str] = []

    class Capture:
        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    before = Path(node_of(built_node_minimal).path("raw")).stat().st_mtime_ns
    builder = Builder(load_tree(Path(node_of(built_node_minimal).dir).parents[2]), "default", [], Progress(Capture()))
    (again,) = builder.build(["node-minimal"])
    assert node_of(again).cached and node_of(again).key == node_of(built_node_minimal).key
    assert any("assemble" in x and "cached" in x for x in lines)
    assert node_of(again).path("raw").stat().st_mtime_ns == before


def test_netboot_alone_makes_no_disk_and_the_same_root_archive(built_node_minimal: BuildResult,
                                                               scratch_tree: Path) -> None:
    """Only the makers of the formats asked for run: no disk is made for a netboot-only node, and
    its root archive is the one a build of every format makes; a disk boot is refused with the
    formats that would do."""
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder

    (result,) = Builder(load_tree(scratch_tree), "default", [], Progress(), formats=["netboot"]).build(
        ["node-minimal"])[-1:]
    art = node_of(result)
    assert set(art.files) == {"kernel", "initrd", "rootfs", "ipxe"}
    assert not list(Path(art.dir).glob("disk.*"))
    assert art.sha256["rootfs.tar.gz"] == node_of(built_node_minimal).sha256["rootfs.tar.gz"]
    with pytest.raises(EnvironmentProblem, match=r"add raw or qcow2 to outputs\.formats"):
        boot.qemu_command(art, "bios", "tcg", scratch_tree)


@pytest.fixture(scope="module")
def boot_report(built_node_minimal: BuildResult,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """nodeforge test --boot on node-minimal: all three modes, one report."""
    from builder.definitions.load import load_tree
    from builder.verify.run import run_tests

    report = tmp_path_factory.mktemp("boot-report")
    tree = load_tree(Path(node_of(built_node_minimal).dir).parents[2])
    rc = run_tests(built_node_minimal.plan, report, boot=True, tree=tree, boot_modes=boot.MODES)
    data = json.loads((report / "node-minimal.json").read_text())
    return rc, data, report


@pytest.mark.parametrize("mode", boot.MODES)
def test_node_minimal_boots_and_every_boot_check_passes(boot_report: tuple[int, dict[str, Any], Path],
                                                        mode: str) -> None:
    _rc, data, _ = boot_report
    mine = [r for r in data["results"] if (r["scope"] == "boot" and r["name"].endswith(f"[{mode}]"))
            or (r["kind"] == "verdict" and r["name"].endswith(f"({mode})"))]
    verdict = [r for r in mine if r["kind"] == "verdict"]
    assert len(verdict) == 1 and verdict[0]["status"] == "passed", verdict
    checks = [r for r in mine if r["kind"] != "verdict"]
    failed = [f"{r['layer']}: {r['name']}: {r['message']}" for r in checks if r["status"] != "passed"]
    assert not failed, failed
    assert {r["layer"] for r in checks} >= BOOT_LAYERS
    kinds = {r["kind"] for r in checks}
    assert {"cmdline", "sysctl", "module", "service", "command"} <= kinds


def test_boot_results_are_in_the_junit_report(boot_report: tuple[int, dict[str, Any], Path]) -> None:
    rc, data, report = boot_report
    assert rc == 0, [r for r in data["results"] if r["status"] == "failed"]
    junit = (report / "node-minimal.junit.xml").read_text()
    assert 'name="node-minimal.boot"' in junit and "boots to a verdict (uefi)" in junit


def test_wrong_root_is_reported_as_root_not_found(built_node_minimal: BuildResult, tmp_path: Path) -> None:
    art = node_of(built_node_minimal)
    wrong = art.cmdline.replace(f"root=LABEL={art.root_label}", "root=LABEL=no-such-root")
    assert wrong != art.cmdline
    o = boot.boot(art, "direct", tmp_path / "wrong-root.log", tests=[], cmdline=wrong)
    assert o.verdict == "failed"
    assert o.reason.startswith("root file system not found"), o.reason
    assert "timed out" not in o.reason
    assert "no-such-root" in o.log.read_text(errors="replace")


BROKEN_LAYER = textwrap.dedent("""\
    name: failing-unit
    summary: A unit that fails at boot (the verdict must catch it)
    applies-to: [node]
    files:
      - path: /etc/systemd/system/nodeforge-broken.service
        content: |
          [Unit]
          Description=A unit that always fails
          [Service]
          Type=oneshot
          ExecStart=/bin/false
          [Install]
          WantedBy=multi-user.target
    services:
      enable: [nodeforge-broken.service]
    """)

BROKEN_IMAGE = textwrap.dedent("""\
    name: broken-node
    summary: node-minimal with a unit that fails
    kind: node
    version: "0.1.0"
    from: {image: node-minimal}
    layers: [failing-unit]
    outputs:
      tags: [nodeforge-test/broken-node:0.1.0]
      formats: [qcow2]
    """)


def test_failing_unit_fails_the_boot_with_its_name(built_node_minimal: BuildResult, scratch_tree: Path) -> None:
    from builder.compose import compose
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder

    (scratch_tree / "layers" / "failing-unit").mkdir()
    (scratch_tree / "layers" / "failing-unit" / "layer.yaml").write_text(BROKEN_LAYER)
    (scratch_tree / "images" / "broken-node.yaml").write_text(BROKEN_IMAGE)
    tree = load_tree(scratch_tree)
    results = Builder(tree, "default", [], Progress()).build(["broken-node"])
    art = node_of(results[-1])
    assert art is not None and set(art.files) >= {"qcow2", "kernel", "initrd"} and "raw" not in art.files
    plan = compose(tree, "broken-node", "default")
    tests = [t for t in plan.tests if t.scope == "boot" and t.layer == "sysctl"]
    o = boot.boot(art, "direct", scratch_tree / "broken.log", tests=tests)
    assert o.verdict == "failed"
    assert "nodeforge-broken.service" in o.reason, o.reason
    assert "timed out" not in o.reason
    assert len(o.report.probes) == len(tests), "the checks still report on a degraded boot"


def test_netboot_artifacts_boot_with_the_root_in_ram(built_node_minimal: BuildResult, tmp_path: Path) -> None:
    """The kernel, initrd and root archive boot as boot.ipxe boots them: the root archive is
    fetched over HTTP into RAM, and the layers' boot checks pass there too."""
    from builder.plan import Test

    art = node_of(built_node_minimal)
    tests = [t for t in built_node_minimal.plan.tests if t.scope == "boot" and t.layer in ("sysctl", "kernel-args")]
    in_ram = Test("the root is in RAM", "netboot", "boot", "command",
                  {"run": "findmnt -n -o FSTYPE /", "exit": 0, "timeout": 30, "stdout": {"contains": ["tmpfs"]}},
                  (), "tests/test_node.py", None)
    o = boot.boot(art, "netboot", tmp_path / "netboot.log", tests=[*tests, in_ram])
    assert o.verdict == "passed", (o.reason, o.tail())
    assert "boot=nodeforge-net" in o.log.read_text(errors="replace")
    for i, t in enumerate([*tests, in_ram]):
        assert boot.guest.judge(t, *o.report.probes[i]) == "", t.name


def test_netboot_refuses_a_root_archive_with_the_wrong_sha256(built_node_minimal: BuildResult,
                                                              tmp_path: Path) -> None:
    art = node_of(built_node_minimal)
    good = art.sha256["rootfs.tar.gz"]
    bad = ("0" if good[0] != "0" else "1") + good[1:]
    o = boot.boot(art, "netboot", tmp_path / "bad-sum.log", tests=[], root_sha256=bad)
    assert o.verdict == "failed"
    assert o.reason.startswith("netboot failed") and "does not have sha256" in o.reason, o.reason
