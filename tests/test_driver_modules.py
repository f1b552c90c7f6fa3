"""nvidia-driver: open or proprietary kernel modules (D4), the profiling option and the key the driver
prints (D1, D2), the kernel held with the driver (D5), and the configs' driver choices.

Composed offline: the plan's packages, holds, files, steps and tests for each choice, and the
definition errors that refuse a choice the site's GPU cannot use."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from support.configs import DGX_OPEN_MODULES

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError
from builder.plan import BuildPlan

# What /proc/driver/nvidia/params prints for the profiling option on a 535 driver: nv_procfs_read_params
# writes "%s: %u" for each entry of nv_parms, and nv-reg.h names this entry by its registry key
# (NV_DEFINE_PARAMS_TABLE_ENTRY_CUSTOM_NAME(__NV_RM_PROFILING_ADMIN_ONLY, ...): "RmProfilingAdminOnly"),
# not by the module parameter alias RestrictProfilingToAdminUsers (open-gpu-kernel-modules 535.261.03,
# kernel-open/nvidia/nv-procfs.c and nv-reg.h). An excerpt, in the driver's order.
PARAMS_ADMIN_ONLY = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
ExcludedGpus: ""
"""
# /proc/driver/nvidia/version: the open modules' id string (nv-kernel.o_binary of Debian's 535.261.03 open
# package) and the proprietary one's
GCC = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
VERSION_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build  "
                "(buildd@debian)  Sat Dec 20 23:05:31 UTC 2025\n" + GCC)
VERSION_PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Release Build  "
                       "(buildd@debian)  Sat Dec 20 23:05:31 UTC 2025\n" + GCC)


def plan_of(tree: Any, config: str, *sets: str, image: str = "gpu-node") -> BuildPlan:
    return compose(tree, image, config, parse_sets(list(sets)))


def driver_step(plan: BuildPlan) -> Any:
    (step,) = [s for s in plan.steps if s.layer == "nvidia-driver"]
    return step


def files_of(plan: BuildPlan) -> dict[str, str]:
    return {f.path: f.content for s in plan.steps for f in s.files if f.content is not None}


def problems(tree: Any, config: str, *sets: str) -> list[str]:
    with pytest.raises(DefinitionError) as e:
        plan_of(tree, config, *sets)
    return [f"{p.path}: {p.message} fix: {p.remedy}" for p in e.value.problems]


def driver_tests(plan: BuildPlan) -> dict[str, Any]:
    return {t.name: t for t in plan.tests if t.layer == "nvidia-driver"}


def stdout_passes(spec: dict[str, Any], text: str) -> bool:
    m = spec["stdout"]
    return (all(s in text for s in m.get("contains", [])) and not any(s in text for s in m.get("not-contains", []))
            and (m.get("matches") is None or re.search(m["matches"], text) is not None))


# --- D4: the kernel module choice ----------------------------------------------------------------

def test_d4_proprietary_modules_are_the_default(tree: Any) -> None:
    plan = plan_of(tree, "default")
    assert plan.params["nvidia-driver.kernel_module"].value == "proprietary"
    assert "nvidia-kernel-dkms" in plan.packages and "nvidia-open-kernel-dkms" not in plan.packages
    assert "options nvidia-current NVreg_" in files_of(plan)["/etc/modprobe.d/nodeforge-nvidia-driver.conf"]
    assert "dkms-build-check nvidia-current 535.309.01" in driver_step(plan).apply  # the security version


def test_d4_dgx_h100_runs_the_proprietary_modules_at_the_security_driver(tree: Any) -> None:
    plan = plan_of(tree, "dgx-h100")
    assert plan.params["nvidia-driver.kernel_module"].value == "proprietary"
    assert plan.params["nvidia-driver.kernel_module"].source.startswith("config dgx-h100")
    assert "dkms-build-check nvidia-current 535.309.01" in driver_step(plan).apply
    assert "nvidia-fabricmanager-535=535.309.01-1" in driver_step(plan).apply


def test_d4_open_modules_install_debian_contribs_package(tree: Any) -> None:
    plan = plan_of(tree, "dgx-h100", *DGX_OPEN_MODULES)
    assert plan.params["nvidia-driver.kernel_module"].value == "open"
    assert "nvidia-open-kernel-dkms" in plan.packages and "nvidia-kernel-dkms" not in plan.packages
    step = driver_step(plan)
    assert "apt-mark hold nvidia-open-kernel-dkms" in step.install and "nvidia-open-kernel-support" in step.install
    # Debian's open package renames the modules nvidia-current-open*, and its install line loads that name
    assert "dkms-build-check nvidia-current-open 535.261.03" in step.apply
    options = files_of(plan)["/etc/modprobe.d/nodeforge-nvidia-driver.conf"]
    assert re.search(r"^options nvidia-current-open NVreg_RestrictProfilingToAdminUsers=1$", options, re.M), options
    tests = driver_tests(plan)
    assert tests["dkms shows the module installed for the image kernel"].spec["stdout"]["matches"].startswith(
        "nvidia-current-open/535\\.261\\.03, ")
    install = tests["Debian's install line maps nvidia onto the renamed module"].spec["stdout"]["contains"]
    assert install == ["modprobe -i nvidia-current-open"]
    run = tests["modprobe applies the NVreg options to Debian's module name"].spec["run"]
    assert shlex.split(run.split("|")[1])[:3] == ["awk", "-v", "m=nvidia_current_open"], run


def test_d4_v100_slurm_keeps_the_proprietary_modules_explicitly(tree: Any) -> None:
    plan = plan_of(tree, "v100-slurm")
    assert plan.params["nvidia-driver.kernel_module"].value == "proprietary"
    assert plan.params["nvidia-driver.kernel_module"].source.startswith("config v100-slurm")
    assert "nvidia-kernel-dkms" in plan.packages


def test_d4_open_modules_for_a_volta_config_are_a_definition_error_naming_the_model(tree: Any) -> None:
    found = problems(tree, "v100-slurm", "nvidia-driver.kernel_module=open")
    hit = [p for p in found if "open-modules-drive-the-site-gpu" in p]
    assert hit, found
    assert '"Tesla V100-SXM2-32GB"' in hit[0] and "older than Turing" in hit[0]
    assert "set nvidia-driver.kernel_module: proprietary" in hit[0]


@pytest.mark.parametrize(("model", "refused"), [
    ("Tesla V100-SXM2-32GB", True), ("Tesla V100S-PCIE-32GB", True), ("Tesla P100-PCIE-16GB", True),
    ("Tesla K80", True), ("Quadro GV100", True), ("Tesla P40", True),
    ("Tesla T4", False), ("NVIDIA A100-SXM4-80GB", False), ("NVIDIA H100 80GB HBM3", False),
    ("NVIDIA L40S", False), ("NVIDIA B200", False), ("none", False),
])
def test_d4_open_modules_are_refused_exactly_for_gpus_older_than_turing(scratch_tree: Path, model: str,
                                                                        refused: bool) -> None:
    (scratch_tree / "configs/site.yaml").write_text(
        f"name: site\nsummary: one GPU model\nsite:\n  gpu: {{model: '{model}', count: 1, memory-mib: 1}}\n"
        "params:\n  nvidia-driver: {kernel_module: open}\n")
    tree = load_tree(scratch_tree)
    if refused:
        assert any("open-modules-drive-the-site-gpu" in p and model in p for p in problems(tree, "site"))
    else:
        assert "nvidia-open-kernel-dkms" in plan_of(tree, "site").packages


def test_d4_open_modules_need_the_nvidia_flavour(tree: Any) -> None:
    found = problems(tree, "dgx-h100", *DGX_OPEN_MODULES, "nvidia-driver.flavour=tesla-535")
    assert any("open-modules-only-in-the-nvidia-flavour" in p and "tesla-535" in p for p in found), found


def test_d4_boot_tests_tell_open_from_proprietary_modules(tree: Any) -> None:
    open_tests = driver_tests(plan_of(tree, "dgx-h100", *DGX_OPEN_MODULES))
    prop_tests = driver_tests(plan_of(tree, "v100-slurm"))
    opened = open_tests["the driver runs the open kernel modules"].spec
    prop = prop_tests["the driver runs the proprietary kernel modules"].spec
    assert "the driver runs the proprietary kernel modules" not in open_tests
    assert stdout_passes(opened, VERSION_OPEN) and not stdout_passes(opened, VERSION_PROPRIETARY)
    assert stdout_passes(prop, VERSION_PROPRIETARY) and not stdout_passes(prop, VERSION_OPEN)


# --- D1, D2: the profiling option ----------------------------------------------------------------

def test_d1_gpu_boot_test_reads_the_key_the_driver_prints(tree: Any) -> None:
    spec = driver_tests(plan_of(tree, "dgx-h100"))["the NVIDIA driver loads and nvidia-smi sees the GPUs"].spec
    output = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n" + VERSION_PROPRIETARY.replace("535.261.03", "535.309.01")
              + PARAMS_ADMIN_ONLY)
    assert "RmProfilingAdminOnly: 1" in spec["stdout"]["contains"]
    assert stdout_passes(spec, output)
    assert not stdout_passes(spec, output.replace("RmProfilingAdminOnly: 1", "RmProfilingAdminOnly: 0"))
    assert not stdout_passes(spec, output.replace("535.309.01", "535.261.03"))  # the version the image ships


def test_d2_profiling_counters_stay_admin_only_by_default_and_on_the_dgx(tree: Any) -> None:
    for config in ("default", "dgx-h100", "v100-slurm"):
        plan = plan_of(tree, config)
        assert plan.params["nvidia-driver.profiling_for_all_users"].value is False, config
        assert "NVreg_RestrictProfilingToAdminUsers=1" in files_of(plan)["/etc/modprobe.d/nodeforge-nvidia-driver.conf"]
    opted = plan_of(tree, "dgx-h100", "nvidia-driver.profiling_for_all_users=true")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in files_of(opted)["/etc/modprobe.d/nodeforge-nvidia-driver.conf"]
    spec = driver_tests(opted)["the NVIDIA driver loads and nvidia-smi sees the GPUs"].spec
    assert "RmProfilingAdminOnly: 0" in spec["stdout"]["contains"]


# --- D5: the kernel is held with the driver ------------------------------------------------------

@pytest.mark.parametrize("config", ["default", "dgx-h100", "v100-slurm"])
def test_d5_kernel_meta_packages_are_held_with_the_driver(tree: Any, config: str) -> None:
    step = driver_step(plan_of(tree, config))
    (hold,) = [line for line in step.install.splitlines() if line.startswith("apt-mark hold ")]
    assert {"linux-image-amd64", "linux-headers-amd64"} <= set(hold.split()[2:]), hold
    test = driver_tests(plan_of(tree, config))[
        "the kernel meta packages are held with the driver (a DKMS rebuild on the node would be unsigned)"]
    assert test.spec["stdout"]["contains"] == ["linux-image-amd64", "linux-headers-amd64"]


# --- the configs' side of A2, IO1 and M6 ---------------------------------------------------------

def test_a2_dgx_h100_config_leaves_vt_d_off(tree: Any) -> None:
    plan = plan_of(tree, "dgx-h100")
    args = [a.value for a in plan.kernel_args]
    assert "intel_iommu=on" not in args, args
    assert not plan.params["kernel-args.intel_iommu"].source.startswith("config"), "the bare-metal DGX sets no VT-d"


def test_io1_v100_config_leaves_the_raid_geometry_to_mkfs(tree: Any) -> None:
    plan = plan_of(tree, "v100-slurm")
    for p in ("io-tuning.scratch_stride", "io-tuning.scratch_stripe_width"):
        assert not plan.params[p].source.startswith("config"), (p, plan.params[p])


def test_m6_v100_config_sets_the_v100_temperature_limits(tree: Any) -> None:
    plan = plan_of(tree, "v100-slurm")
    assert plan.params["gpu-monitoring.temp_gpu_celsius"].value == 83
    assert plan.params["gpu-monitoring.temp_memory_celsius"].value == 85


def test_d4_cdi_refresh_is_not_skipped_on_open_modules(tree: Any) -> None:
    """The toolkit's nvidia-cdi-refresh.service has `ExecCondition=grep -qE '/(nvidia|nvidia-current)\\.ko'
    modules.dep`, which never matches Debian's nvidia-current-open.ko: the drop-in must reset it (an empty
    ExecCondition= first) or no CDI spec is made on an open-module node."""
    dropin = files_of(plan_of(tree, "dgx-h100"))["/etc/systemd/system/nvidia-cdi-refresh.service.d/50-nodeforge.conf"]
    lines = [line for line in dropin.splitlines() if line.startswith("ExecCondition=")]
    assert lines == ["ExecCondition=", "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present"], dropin
