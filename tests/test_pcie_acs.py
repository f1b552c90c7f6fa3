"""kernel-args: the PCIe policy (A1), no dracut syntax (A3) and the ACS boot unit (A2).

The ACS script runs against fake lspci/setpci (tests/fakes/bin/replay, linked under those names in
the test's directory) replaying recorded `lspci -D -vvv -d ::0604` of a DGX-H100-like node
(tests/fixtures/pcie, see its README): two PCIe switch trees (Broadcom PEX890xx) with ACS on, as
the kernel leaves it when an IOMMU driver is active. The calls the script made are read back from
the fakes' log and asserted exactly.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.fake_tools import FAKES, fake_tools
from support.trees import nodeforge, scratch_image, tree_with_layers

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "layers" / "kernel-args" / "files" / "pcie-acs"
PCIE = ROOT / "tests" / "fixtures" / "pcie"
SWITCH_DOWNSTREAM = ["0000:17:00.0", "0000:17:01.0", "0000:17:02.0", "0000:99:00.0", "0000:99:01.0", "0000:99:02.0"]
ROOT_PORTS = ["0000:15:01.0", "0000:97:01.0"]


def run(scenario: str, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("lspci", "setpci"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(FAKES / "replay")
    env, calls = fake_tools(PCIE / scenario, tmp, base={"PATH": "/usr/bin:/bin"})
    proc = subprocess.run([str(SCRIPT), *args, "--lspci", str(bin_dir / "lspci"), "--setpci", str(bin_dir / "setpci")],
                          capture_output=True, text=True, env=env, timeout=60)
    return proc, calls()


def test_a2_acs_cleared_on_every_switch_downstream_port_and_read_back(tmp_path: Path) -> None:
    proc, calls = run("dgx-h100-acs-on", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    setpci = [c["argv"] for c in calls if c["tool"] == "setpci"]
    assert setpci == [["-s", bdf, "ECAP_ACS+0x6.w=0000"] for bdf in SWITCH_DOWNSTREAM]
    # root ports and switch upstream ports are left alone
    assert not any(bdf in str(c) for c in setpci for bdf in [*ROOT_PORTS, "0000:16:00.0", "0000:98:00.0"])
    assert [c["tool"] for c in calls] == ["lspci", *["setpci"] * 6, "lspci"], "read back after the writes"
    assert "OK: 6 PCIe switch downstream port(s) with ACS" in proc.stdout


def test_a2_acs_still_on_after_the_unit_fails_naming_the_port(tmp_path: Path) -> None:
    """The failing fixture: one port (GPU0's, 0000:17:02.0) keeps SrcValid+/ReqRedir+/CmpltRedir+."""
    proc, _ = run("dgx-h100-acs-stuck", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stdout.splitlines() if "FAIL" in line]
    assert fails == ["pcie-acs: FAIL: 0000:17:02.0: ACSCtl SrcValid+ ReqRedir+ CmpltRedir+: "
                     "peer-to-peer traffic is redirected through the root complex"]


def test_a2_check_reports_redirecting_ports_and_changes_nothing(tmp_path: Path) -> None:
    proc, calls = run("dgx-h100-acs-on", tmp_path, "--check")
    assert proc.returncode == 1
    assert [c["tool"] for c in calls] == ["lspci"]
    failing = sorted(line.split()[2].rstrip(":") for line in proc.stdout.splitlines() if "FAIL" in line)
    assert failing == SWITCH_DOWNSTREAM


def test_a2_ports_already_clear_are_not_written(tmp_path: Path) -> None:
    proc, calls = run("dgx-h100-acs-off", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [c["tool"] for c in calls] == ["lspci"]
    ok, _ = run("dgx-h100-acs-off", tmp_path / "check", "--check")
    assert ok.returncode == 0 and "none redirects" in ok.stdout


def test_a2_capabilities_unreadable_is_an_error_not_a_pass(tmp_path: Path) -> None:
    proc, calls = run("dgx-h100-not-root", tmp_path, "--check")
    assert proc.returncode == 2 and "run as root" in proc.stderr
    assert all(c["tool"] == "lspci" for c in calls)


# --- the layer --------------------------------------------------------------------------------

def _cmdline(*sets: str) -> list[str]:
    return compose(load_tree(ROOT), "node-minimal", "default", parse_sets(list(sets))).cmdline.split()


def test_a1_no_pcie_bus_perf_by_default() -> None:
    args = _cmdline()
    assert not any(a.startswith("pci=") for a in args), args
    assert "pci=pcie_bus_peer2peer" in _cmdline("kernel-args.pci_bus=pcie_bus_peer2peer")


def test_a3_no_dracut_syntax_on_an_initramfs_tools_image() -> None:
    args = _cmdline()
    assert not any(a.startswith("rd.") for a in args), args
    assert "module_blacklist=nouveau" in args


ACS_IMAGE = scratch_image("acs-scratch", "a node with kernel-args", ["base", "kernel-args"])


@pytest.mark.parametrize(("acs", "condition"), [("auto", True), ("disable", False)])
def test_a2_unit_shipped_and_conditioned_on_an_active_iommu(tmp_path: Path, acs: str, condition: bool) -> None:
    tree = tree_with_layers(tmp_path, ("base", "kernel-args"), {"acs-scratch": ACS_IMAGE})
    out = tmp_path / "render"
    proc = nodeforge(tree, "render", "acs-scratch", str(out), "--set", f"kernel-args.acs={acs}")
    assert proc.returncode == 0, proc.stderr
    (unit,) = out.glob("*-kernel-args/root/etc/systemd/system/nodeforge-pcie-acs.service")
    text = unit.read_text()
    assert "ExecStart=/usr/lib/nodeforge/pcie-acs\n" in text and "Type=oneshot" in text
    assert "Before=nvidia-persistenced.service" in text
    assert ("ConditionDirectoryNotEmpty=/sys/class/iommu" in text) is condition
    assert (next(out.glob("*-kernel-args/root/usr/lib/nodeforge/pcie-acs"))).read_bytes() == SCRIPT.read_bytes()
    plan = compose(load_tree(tree), "acs-scratch", "default", parse_sets([f"kernel-args.acs={acs}"]))
    assert "nodeforge-pcie-acs.service" in [v.value for v in plan.services_enabled]


def test_a2_acs_leave_ships_no_unit(tmp_path: Path) -> None:
    tree = tree_with_layers(tmp_path, ("base", "kernel-args"), {"acs-scratch": ACS_IMAGE})
    out = tmp_path / "render"
    proc = nodeforge(tree, "render", "acs-scratch", str(out), "--set", "kernel-args.acs=leave")
    assert proc.returncode == 0, proc.stderr
    assert not list(out.glob("*-kernel-args/root/etc/systemd/system/nodeforge-pcie-acs.service"))
    assert not list(out.glob("*-kernel-args/root/usr/lib/nodeforge/pcie-acs"))
    plan = compose(load_tree(tree), "acs-scratch", "default", parse_sets(["kernel-args.acs=leave"]))
    assert "nodeforge-pcie-acs.service" not in [v.value for v in plan.services_enabled]
