"""Direct tests of the pure logic behind the engine and qemu tests: the guest report parser and
the boot verdict, disk layout arithmetic and boot loader text, lock files and their diffs, the
SBOM document, `nodeforge diff`'s extractors, rebuild reasons, text matchers and reports. Each
runs in milliseconds, so a red engine suite can be told apart from a red function."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from builder import lockfile
from builder.checks import kargs
from builder.compose.contributions import KINDS
from builder.diff import _map_diff, _set_diff
from builder.engine import cache, sbom
from builder.errors import BuildFailed, DefinitionError
from builder.node import assemble
from builder.plan import Base, BuildPlan, ContextFile, LayerStep
from builder.plan import Test as PlanTest
from builder.verify import boot, guest
from builder.verify.report import write_reports
from builder.verify.result import Result, judge_package, match_text
from builder.verify.run import select


def enc(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode())).decode()


def report_of(lines: list[str]) -> guest.GuestReport:
    r = guest.GuestReport()
    for line in lines:
        r.feed(line)
    return r


M = guest.MARKER
GOOD = [f"[  OK  ] {M} BEGIN 2 abc", f"{M} R 0 0 {enc('1')} {enc('')}", f"noise {M} R 1 3 {enc('out')} {enc('err')}",
        f"{M} STATE running", f"{M} FAILED {enc('')}", f"{M} JOURNAL {enc('')}",
        f"{M} TIME {base64.b64encode(b'Startup finished in 4s').decode()}", f"{M} END"]


def test_guest_report_reads_every_line_kind() -> None:
    r = report_of(GOOD)
    assert (r.begun, r.ended, r.state) == (True, True, "running")
    assert r.probes == {0: (0, "1", ""), 1: (3, "out", "err")}
    assert r.boot_time == "Startup finished in 4s" and r.garbled == [] and r.failed_units == []


def test_guest_report_marks_a_garbled_probe_line() -> None:
    r = report_of([f"{M} BEGIN 1 abc", f"{M} R 0 0 !!notbase64 {enc('')}", "no marker here", f"{M} END"])
    assert r.garbled == [0] and r.probes == {}


def outcome(lines: list[str], noted: list[str] | None = None) -> boot.BootOutcome:
    return boot.BootOutcome("direct", "tcg", "failed", "", 1.0, Path("/nonexistent"), report_of(lines), noted or [])


def test_boot_verdict() -> None:
    t = [PlanTest("t", "l", "boot", "sysctl", {"key": "vm.x", "value": 1}, (), "f", 1)]
    assert boot._judge(outcome(GOOD), t) == ""
    assert boot._judge(outcome(GOOD), None) == ""
    assert "without running the checks" in boot._judge(outcome([]), t)
    assert "stopped before its end" in boot._judge(outcome(GOOD[:-1]), t)
    failed = [*GOOD[:3], f"{M} STATE degraded", f"{M} FAILED {enc('x.service')}", *GOOD[5:]]
    assert boot._judge(outcome(failed), t) == "failed units: x.service"
    assert "Failed to start y" in boot._judge(outcome(GOOD, ["Failed to start y"]), t)


def test_console_watcher_finds_the_fatal_line_and_notes_failures() -> None:
    w = boot.ConsoleWatcher()
    for line in ["Booting", "\x1b[0;31mFailed to start x.service\x1b[0m", "Kernel panic - not syncing: VFS"]:
        w.scan(line)
    assert w.fatal.startswith("kernel panic") or "panic" in w.fatal.lower()
    assert w.noted == ["Failed to start x.service"]
    quiet = boot.ConsoleWatcher()
    quiet.scan(f"{M} R 0 1 {enc('Kernel panic')} {enc('')}")  # the guest's own report is never fatal
    assert quiet.fatal == ""


def test_root_size_and_bios_boot_offsets(tmp_path: Path) -> None:
    # a quarter of headroom, at least 256 MiB, rounded up to 64 MiB (a small edit keeps the size)
    assert assemble.root_size_mib(100, None) == 384 and assemble.root_size_mib(4000, None) == 5056
    assert assemble.root_size_mib(3960, None) == assemble.root_size_mib(3965, None) == 4992
    assert assemble.root_size_mib(100, 4096) == 4096 - assemble.ROOT_START_MIB - 1
    with pytest.raises(BuildFailed, match="too small"):
        assemble.root_size_mib(4000, 2048)
    if not (assemble.GRUB_PC_DIR / "boot.img").exists():
        pytest.skip("grub-pc-bin is not installed (make setup installs it)")
    disk = tmp_path / "disk"
    disk.write_bytes(b"\0" * (assemble.ROOT_START_MIB * assemble.MIB))
    core = bytes(range(256)) * 8
    assemble.write_bios_boot(disk, core)
    data = disk.read_bytes()
    start = assemble.BIOS_START_MIB * assemble.MIB // 512
    assert int.from_bytes(data[0x5C:0x64], "little") == start and data[0x66:0x68] == b"\x90\x90"
    written = data[start * 512:start * 512 + len(core)]
    assert int.from_bytes(written[0x200 - 12:0x200 - 4], "little") == start + 1
    assert written[:0x200 - 12] == core[:0x200 - 12]


def node(cmdline: str) -> assemble.NodeArtifacts:
    return assemble.NodeArtifacts("n", "k" * 64, "c", "/tmp", "6.1.0-28-amd64", cmdline, "nf-root", "uuid", 600, 500,
                                  files={"kernel": "vmlinuz", "initrd": "initrd.img", "rootfs": "rootfs.tar.gz"})


def test_grub_config_and_ipxe_script() -> None:
    art = node("root=LABEL=nf-root ro console=ttyS0,115200n8 iommu=pt")
    assert assemble.serial_unit(art.cmdline) == (0, 115200) and assemble.serial_unit("quiet") is None
    cfg = assemble.grub_config(art, "n", "1")
    assert "serial --unit=0 --speed=115200" in cfg and "/boot/vmlinuz-6.1.0-28-amd64" in cfg and "iommu=pt" in cfg
    ipxe = assemble.ipxe_script(art, "n", "1", "f" * 64)
    assert ipxe.startswith("#!ipxe") and "nodeforge.root_sha256=" + "f" * 64 in ipxe
    kernel_line = next(x for x in ipxe.splitlines() if x.startswith("kernel "))
    assert "root=LABEL" not in kernel_line and " ro " not in kernel_line and "iommu=pt" in kernel_line


def test_lock_round_trip_pins_and_diff(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    old = lockfile.Lock("img", "b", {"base": {"direct": {"curl": "7.88.1-10"}, "deps": {"libc6": "2.36-9"}}})
    lockfile.write(tmp_path, old)
    again = lockfile.read(tmp_path, "img")
    assert again is not None and again.layers == old.layers
    assert lockfile.pins(again, "base", ["curl", "wget"]) == (["curl=7.88.1-10", "wget"], False)
    assert lockfile.pins(again, "base", ["curl"]) == (["curl=7.88.1-10"], True)
    new = lockfile.Lock("img", "b", {"base": {"direct": {"curl": "7.88.1-11"}, "deps": {"libc6": "2.36-9"}}})
    assert lockfile.diff(old, new) == ["- base: curl 7.88.1-10", "+ base: curl 7.88.1-11"]
    assert lockfile.diff(new, new) == []
    lockfile.path_for(tmp_path, "bad").write_text("layers: [1, 2]\n")
    with pytest.raises(DefinitionError) as e:
        lockfile.read(tmp_path, "bad")
    assert "expected a mapping of layers" in e.value.render() and "nodeforge lock bad" in e.value.render()


def plan_of(steps: tuple[LayerStep, ...] = ()) -> BuildPlan:
    return BuildPlan(1, "img", "container", "1", "s", None, Base("debian", "b" * 64, {}, None, 1700000000), steps,
                     ("nodeforge/img:1",), {}, {}, {}, {}, (), (), {}, (), (), (), {}, {}, (), {}, ())


DPKG = ("Package: curl\nStatus: install ok installed\nArchitecture: amd64\nVersion: 7.88.1-10\nMaintainer: A <a@b>\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n")


def test_sbom_lists_installed_debs_and_wheels() -> None:
    text = DPKG + "@@nodeforge-wheel /opt/x.dist-info\nName: cupy-cuda12x\nVersion: 13.4.1\nLicense: MIT\n\n"
    doc = sbom.document(plan_of(), text.replace("@@nodeforge-wheel ", sbom._MARK))
    names = [p["name"] for p in doc["packages"]]
    assert names == ["img", "curl", "cupy-cuda12x"]
    assert sbom.counts(doc) == {"deb": 1, "pypi": 1}
    assert doc["creationInfo"]["created"] == "2023-11-14T22:13:20Z"
    assert len(doc["relationships"]) == 3


class Facts:
    def __init__(self, texts: dict[str, str], files: dict[str, tuple[str, str]], env: dict[str, str]) -> None:
        self.texts, self.files, self.env, self.labels = texts, files, env, {"a": "1",
                                                                             "org.opencontainers.image.revision": "x"}


def test_diff_extractors_of_the_contribution_table() -> None:
    img = Facts({"etc/sysctl.d/90-nodeforge-sysctl.conf": "# c\nvm.swappiness = 1\n",
                 "etc/nodeforge/kernel-cmdline.d/k.conf": "# c\niommu=pt pci=pcie_bus_perf\n",
                 "etc/modprobe.d/x.conf": "blacklist nouveau\n", "var/lib/dpkg/status": DPKG},
                {"etc/systemd/system/multi-user.target.wants/x.service": ("link", "/lib/x")}, {"PATH": "/bin"})
    got = {k.diff.title: k.diff.extract(img) for k in KINDS if k.diff}
    assert got["sysctl"] == {"vm.swappiness": "1"}
    assert got["kernel arguments"] == {"iommu=pt", "pci=pcie_bus_perf"}
    assert got["module options and blacklist"] == {"blacklist nouveau"}
    assert got["services enabled"] == {"multi-user.target.wants/x.service"}
    assert got["packages"] == {"curl": "7.88.1-10"} and got["env"] == {"PATH": "/bin"}
    assert got["labels"] == {"a": "1"}  # the revision changes with every commit: not a difference


def test_map_and_set_diffs() -> None:
    assert _map_diff("t", {"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == ["t:", "  - a 1", "  ~ b 2 -> 3", "  + c 4"]
    assert _map_diff("t", {"a": "1"}, {"a": "1"}) == []
    assert _set_diff("t", {"x", "y"}, {"y", "z"}) == ["t:", "  - x", "  + z"]


def step(files: tuple[ContextFile, ...] = (), packages: tuple[str, ...] = ("curl=1",), apply: str = "a") -> LayerStep:
    return LayerStep("l", "s", "k", files, apply, (("A", "1"),), packages, True)


def test_rebuild_reasons() -> None:
    f = ContextFile("/etc/x", "0644", "root", "root", "s1", "o")
    old = cache.fingerprint(step((f,)), "p1", "base")
    assert cache.reason(None, old) == "not built before"
    assert cache.reason(old, old) == "cache entry missing"
    changed = cache.fingerprint(step((ContextFile("/etc/x", "0644", "root", "root", "s2", "o"),)), "p1", "base")
    assert cache.reason(old, changed) == "changed: files /etc/x"
    assert cache.reason(old, cache.fingerprint(step((f,), ("curl=2",)), "p1", "base")) == "changed: packages curl=2"
    assert cache.reason(old, cache.fingerprint(step((f,), apply="b"), "p1", "base")) == "changed: apply script"
    assert cache.reason(old, cache.fingerprint(step((f,)), "p2", "base")) == "changed: after base"


def test_text_matchers_and_package_verdict() -> None:
    assert match_text(None, "x", "out") == ""
    every = {"contains": ["a"], "not-contains": ["z"], "matches": "^a.c$", "equals": " abc "}
    assert match_text(every, "abc", "o") == ""
    assert match_text({"contains": ["q"]}, "abc", "stdout") == "stdout does not contain 'q'"
    assert match_text({"not-contains": ["b"]}, "abc", "o") == "o contains 'b'"
    assert match_text({"matches": "^z"}, "abc", "o") == "o does not match '^z'"
    assert "expected 'x'" in match_text({"equals": "x"}, "abc", "o")
    assert judge_package({"name": "p", "installed": True}, 0, "install ok installed 1.0") == ""
    assert judge_package({"name": "p", "installed": True}, 1, "") == "p is not installed"
    assert judge_package({"name": "p", "installed": False}, 0, "install ok installed 1.0") == "p is installed"
    assert judge_package({"name": "p", "version": "2.0"}, 0, "install ok installed 1.0") == "p is 1.0, expected 2.0"


def test_select_and_reports(tmp_path: Path) -> None:
    tests = (PlanTest("a", "l", "image", "file", {"path": "/x"}, (), "f", 1),
             PlanTest("g", "l", "container", "command", {"run": "nvidia-smi"}, ("gpu",), "f", 2))
    plan = plan_of()
    plan = BuildPlan(**{**plan.__dict__, "tests": tests})
    runnable, skipped = select(plan, {"gpu": False})
    assert [t.name for t in runnable] == ["a"] and skipped[0].message == "requires gpu, not present here"
    results = [Result(tests[0], "failed", "why", 0.5, "output"), *skipped]
    json_path, xml_path = write_reports(plan, results, tmp_path)
    data: dict[str, Any] = json.loads(json_path.read_text())
    assert data["counts"] == {"passed": 0, "failed": 1, "skipped": 1, "not-run": 0}
    suites = ET.parse(xml_path).getroot()
    assert [s.get("name") for s in suites] == ["img.image", "img.container"]
    assert suites[0].find("testcase/failure").get("message") == "why"  # type: ignore[union-attr]
    assert suites[1].find("testcase/skipped") is not None


def test_kernel_argument_table_splits_and_merges() -> None:
    assert kargs.split("pci=a,b") == ("pci", "a,b") and kargs.split("quiet") == ("quiet", None)
    assert kargs.is_multi("pci") and not kargs.is_multi("iommu")
