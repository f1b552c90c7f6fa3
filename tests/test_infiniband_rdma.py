"""infiniband: GPUDirect RDMA that works (I1), the compute HCAs in /etc/nccl.conf (I3), enhanced IPoIB (I2).

The nvidia-peermem loader's --check runs against recorded modinfo/modprobe answers and /proc/kallsyms
excerpts (tests/fixtures/infiniband, replayed by the fake tools); the layer's choices are composed
offline with the configs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.configs import DGX_OPEN_MODULES
from support.fake_tools import FAKES, Calls, fake_tools, overlay

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError
from builder.plan import BuildPlan

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures/infiniband"
LOADER = ROOT / "layers/infiniband/files/nvidia-peermem-load"
API = "ib_register_peer_memory_client"
DGX_COMPUTE_HCAS = "mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"


# --- the loader on recorded tool output ---------------------------------------------------------

def run_loader(tmp: Path, scenario: Path, *args: str, hca: bool = True, kallsyms: Path | None = None,
               loads: bool = False, loaded: bool = False) -> tuple[subprocess.CompletedProcess[str], Calls]:
    """The loader with modinfo and modprobe replaying `scenario`, /sys a tree under tmp (an HCA or none),
    /proc the scenario's (or `kallsyms`'s) kallsyms; `loads`: a load call creates the module's sysfs entry."""
    sysfs, proc, bin_dir = tmp / "sys", tmp / "proc", tmp / "bin"
    for d in (sysfs / "module", sysfs / "class/infiniband", proc, bin_dir / "replay"):
        d.mkdir(parents=True, exist_ok=True)
    if hca:
        (sysfs / "class/infiniband/mlx5_0").mkdir(exist_ok=True)
    if loaded:
        (sysfs / "module/nvidia_peermem").mkdir(exist_ok=True)
    (proc / "kallsyms").write_text((kallsyms or scenario / "proc/kallsyms").read_text())
    for tool in ("modinfo", "modprobe"):  # the replaying fake under the tool's own name
        link = bin_dir / "replay" / tool
        if not link.exists():
            link.symlink_to(FAKES / "replay")
    wrapper = bin_dir / "modprobe"  # a successful load makes the kernel list the module, as modprobe would
    wrapper.write_text("#!/bin/sh\n"
                       + (f'[ "$*" = nvidia-peermem ] && mkdir -p "{sysfs}/module/nvidia_peermem"\n' if loads else "")
                       + f'exec "{bin_dir}/replay/modprobe" "$@"\n')
    wrapper.chmod(0o755)
    (bin_dir / "modinfo").unlink(missing_ok=True)
    (bin_dir / "modinfo").symlink_to(bin_dir / "replay" / "modinfo")
    env, calls = fake_tools(scenario, tmp / "fake")
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", NODEFORGE_SYSFS=str(sysfs), NODEFORGE_PROC=str(proc))
    p = subprocess.run([str(LOADER), *args], capture_output=True, text=True, env=env, timeout=30)
    return p, calls


def test_i1_check_passes_where_the_ofed_module_imports_and_ib_core_exports_the_api(tmp_path: Path) -> None:
    p, calls = run_loader(tmp_path, FIXTURES / "ofed-peermem", "--check")
    assert p.returncode == 0, p.stderr
    assert f"imports {API}, which the running ib_core exports" in p.stdout
    assert ["--dry-run", "--quiet", "nvidia-peermem"] in calls.argv("modprobe")
    assert ["--dump-modversions", "/lib/modules/6.1.0-50-amd64/updates/dkms/nvidia-current-peermem.ko"] in \
        calls.argv("modprobe")


def test_i1_check_refuses_a_module_built_against_the_inbox_ib_core(tmp_path: Path) -> None:
    """The failure of every IB node before: the module file exists and modprobe resolves it, but it is
    the stub that returns EINVAL. The old check (modprobe -n only) passed here."""
    p, calls = run_loader(tmp_path, FIXTURES / "inbox-peermem", "--check")
    assert p.returncode == 1
    assert f"does not import {API}" in p.stderr and "DMA-BUF" in p.stderr
    assert not any(a == ["nvidia-peermem"] for a in calls.argv("modprobe"))  # nothing was loaded


def test_i1_check_refuses_when_the_running_ib_core_lacks_the_api(tmp_path: Path) -> None:
    p, _ = run_loader(tmp_path, FIXTURES / "ofed-peermem", "--check",
                      kallsyms=FIXTURES / "inbox-peermem/proc/kallsyms")
    assert p.returncode == 1 and f"the running ib_core does not export {API}" in p.stderr


def test_i1_check_skips_a_node_without_the_driver(tmp_path: Path) -> None:
    p, _ = run_loader(tmp_path, FIXTURES / "no-driver", "--check")
    assert p.returncode == 1 and "no NVIDIA driver" in p.stderr


def test_i1_check_skips_a_node_without_an_hca(tmp_path: Path) -> None:
    p, calls = run_loader(tmp_path, FIXTURES / "ofed-peermem", "--check", hca=False)
    assert p.returncode == 1 and "no RDMA device" in p.stderr
    assert calls.argv("modprobe") == []


def test_i1_loader_loads_only_what_the_check_proved(tmp_path: Path) -> None:
    p, calls = run_loader(tmp_path / "ofed", FIXTURES / "ofed-peermem", loads=True)
    assert p.returncode == 0 and "nvidia-peermem: loaded" in p.stdout, p.stderr
    assert calls.argv("modprobe")[-1] == ["nvidia-peermem"]
    again, _ = run_loader(tmp_path / "ofed", FIXTURES / "ofed-peermem", loaded=True)
    assert again.returncode == 0 and "already loaded" in again.stdout
    inbox, calls = run_loader(tmp_path / "inbox", FIXTURES / "inbox-peermem", loads=True)
    assert inbox.returncode == 1 and ["nvidia-peermem"] not in calls.argv("modprobe")


def test_i1_loader_reports_a_failed_load(tmp_path: Path) -> None:
    (tmp_path / "err.txt").write_text("modprobe: ERROR: could not insert 'nvidia_peermem': Unknown symbol in module\n")
    scenario = overlay(tmp_path / "s", FIXTURES / "ofed-peermem", "modprobe",
                       [{"args": "nvidia-peermem", "stderr": "err.txt", "exit": 1}],
                       {"err.txt": (tmp_path / "err.txt").read_text()})
    p, _ = run_loader(tmp_path / "run", scenario)
    assert p.returncode == 1 and "modprobe failed" in p.stderr and "Unknown symbol" in p.stderr


def test_loader_is_shellcheck_clean() -> None:
    p = subprocess.run(["shellcheck", str(LOADER)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


# --- the layer's GPUDirect RDMA path, composed ----------------------------------------------------

def plan_of(tree: Any, config: str, *sets: str, image: str = "gpu-node") -> BuildPlan:
    return compose(tree, image, config, parse_sets(list(sets)))


def files_of(plan: BuildPlan) -> dict[str, str]:
    return {f.path: f.content for s in plan.steps for f in s.files if f.content is not None}


def all_paths(plan: BuildPlan) -> set[str]:
    return {f.path for s in plan.steps for f in s.files}


def problems(tree: Any, config: str, *sets: str, image: str = "gpu-node") -> list[str]:
    with pytest.raises(DefinitionError) as e:
        plan_of(tree, config, *sets, image=image)
    return [f"{p.path}: {p.message} fix: {p.remedy}" for p in e.value.problems]


def test_i1_dgx_h100_on_debian_12_has_no_gpudirect_rdma_path(tree: Any) -> None:
    """The proprietary modules export no DMA-BUF and the inbox stack has no peer-memory API."""
    plan = plan_of(tree, "dgx-h100")
    assert plan.params["infiniband.peer_memory"].value == "none"
    assert plan.params["nvidia-driver.kernel_module"].value == "proprietary"
    assert "NCCL_DMABUF_ENABLE" not in files_of(plan)["/etc/nccl.conf"]
    assert not {p for p in all_paths(plan) if "peermem" in p}


def test_i1_dmabuf_with_open_modules_ships_no_peermem_unit(tree: Any) -> None:
    plan = plan_of(tree, "dgx-h100", *DGX_OPEN_MODULES)
    assert plan.params["infiniband.peer_memory"].value == "dmabuf"
    assert plan.params["nvidia-driver.kernel_module"].value == "open"
    assert "NCCL_DMABUF_ENABLE=1\n" in files_of(plan)["/etc/nccl.conf"]
    assert not {p for p in all_paths(plan) if "peermem" in p}
    (ib,) = [s for s in plan.steps if s.layer == "infiniband"]
    assert "nodeforge-nvidia-peermem" not in ib.apply
    names = {t.name for t in plan.tests if t.layer == "infiniband"}
    assert "no nvidia-peermem unit where no OFED stack provides its peer-memory API" in names
    assert "the nvidia-peermem unit did not fail in the booted node" not in names


def test_i1_v100_has_no_peermem_unit_on_the_inbox_stack(tree: Any) -> None:
    plan = plan_of(tree, "v100-slurm")
    assert plan.params["infiniband.peer_memory"].value == "none"
    assert not {p for p in all_paths(plan) if "peermem" in p}
    assert "NCCL_DMABUF_ENABLE" not in files_of(plan)["/etc/nccl.conf"]


def test_i1_dmabuf_with_the_proprietary_modules_is_a_definition_error(tree: Any) -> None:
    found = problems(tree, "dgx-h100", "infiniband.peer_memory=dmabuf")
    hit = [p for p in found if "dmabuf-needs-the-open-gpu-kernel-modules" in p]
    assert hit and "set nvidia-driver.kernel_module: open" in hit[0], found


def test_i1_peermem_without_a_declared_ofed_stack_is_a_definition_error(tree: Any) -> None:
    found = problems(tree, "dgx-h100", "infiniband.peer_memory=peermem")
    assert any("peermem-needs-an-ofed-stack" in p and "infiniband.ofed_layer is empty" in p for p in found), found
    found = problems(tree, "dgx-h100", "infiniband.peer_memory=peermem", "infiniband.ofed_layer=doca-ofed")
    assert any("peermem-needs-an-ofed-stack" in p and "doca-ofed named in infiniband.ofed_layer is not in the image"
               in p for p in found), found


def test_i1_peermem_with_the_ofed_layer_in_the_image_ships_and_enables_the_unit(scratch_tree: Path) -> None:
    (scratch_tree / "layers/site-ofed").mkdir()
    (scratch_tree / "layers/site-ofed/layer.yaml").write_text(
        "name: site-ofed\nsummary: the site's DOCA-OFED (stand-in)\napplies-to: [node]\nrequires: [base]\n")
    cfg = scratch_tree / "configs/v100-slurm.yaml"
    cfg.write_text(cfg.read_text().replace("  node: [slurm-gpu,", "  node: [site-ofed, slurm-gpu,")
                   .replace("    peer_memory: none", "    peer_memory: peermem\n    ofed_layer: site-ofed"))
    plan = plan_of(load_tree(scratch_tree), "v100-slurm")
    assert {"/etc/systemd/system/nodeforge-nvidia-peermem.service", "/usr/lib/nodeforge/nvidia-peermem-load"} <= \
        all_paths(plan)
    (ib,) = [s for s in plan.steps if s.layer == "infiniband"]
    assert "nodeforge-nvidia-peermem.service" in ib.apply
    unit = (ROOT / "layers/infiniband/files/nodeforge-nvidia-peermem.service").read_text()
    assert "ExecCondition=/usr/lib/nodeforge/nvidia-peermem-load --check" in unit


# --- I3: the compute HCAs -----------------------------------------------------------------------

def test_i3_dgx_h100_nccl_conf_names_the_eight_compute_hcas_exactly(tree: Any) -> None:
    plan = plan_of(tree, "dgx-h100")
    conf = files_of(plan)["/etc/nccl.conf"]
    assert f"\nNCCL_IB_HCA=={DGX_COMPUTE_HCAS}\n" in conf
    for storage in ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"):
        assert f"{storage}," not in conf and not conf.rstrip().endswith(storage)
    (test,) = [t for t in plan.tests if t.layer == "infiniband" and t.spec.get("path") == "/etc/nccl.conf"]
    assert all(s in conf for s in test.spec["content"]["contains"])
    other = files_of(plan_of(tree, "dgx-h100", 'infiniband.nccl_ib_hca=["mlx5_0", "mlx5_1"]'))["/etc/nccl.conf"]
    assert not all(s in other for s in test.spec["content"]["contains"])  # the layer's own test notices


@pytest.mark.parametrize("value", ['["mlx5_0 NCCL_NET=Socket"]', '["mlx5_0;reboot"]', '["mlx5_0,mlx5_1"]',
                                   '["=mlx5_0"]'])
def test_i3_nccl_ib_hca_holds_device_names_only(tree: Any, value: str) -> None:
    found = problems(tree, "dgx-h100", f"infiniband.nccl_ib_hca={value}")
    assert any("nccl_ib_hca" in p for p in found), found


def test_i3_no_nccl_ib_hca_line_without_a_list(tree: Any) -> None:
    conf = files_of(plan_of(tree, "v100-slurm"))["/etc/nccl.conf"]
    assert "NCCL_IB_HCA" not in conf


# --- I2: enhanced IPoIB is datagram only --------------------------------------------------------

def test_i2_connected_mode_on_enhanced_ipoib_is_refused_with_the_reason(tree: Any) -> None:
    found = problems(tree, "dgx-h100", "infiniband.ipoib_mode=connected", "infiniband.ipoib_mtu=65520")
    hit = [p for p in found if "ipoib-connected-needs-non-enhanced-ipoib" in p]
    assert hit and "datagram only" in hit[0] and "ConnectX-3" in hit[0], found
    ok = plan_of(tree, "dgx-h100", "infiniband.ipoib_mode=connected", "infiniband.ipoib_mtu=65520",
                 "infiniband.ipoib_enhanced=false")
    assert 'ATTR{mode}="connected", ATTR{mtu}="65520"' in files_of(ok)["/etc/udev/rules.d/70-nodeforge-ipoib.rules"]


def test_i2_the_mtu_documents_the_partition_mtu_it_needs() -> None:
    import yaml

    layer = yaml.safe_load((ROOT / "layers/infiniband/layer.yaml").read_text())
    assert "partition MTU of 4096 at the subnet manager" in " ".join(layer["params"]["ipoib_mtu"]["doc"].split())
