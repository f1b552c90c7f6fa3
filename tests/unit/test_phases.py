"""Build phases (compose.phases): packages first and keyed on what affects them, then each layer's
files and scripts, then the initramfs keyed on exactly its inputs. Pure composition, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.compose import compose
from builder.compose.params import Override
from builder.compose.phases import DIVERTED, engine_steps, standalone_install
from builder.definitions.load import BOOT_PHASE, PACKAGE_PHASE, load_tree
from builder.engine.initramfs import inputs_key
from builder.plan import BuildPlan

ROOT = Path(__file__).resolve().parents[2]


def plan(*sets: Override, image: str = "node-minimal") -> BuildPlan:
    return compose(load_tree(ROOT), image, "default", list(sets))


def keys(p: BuildPlan) -> dict[str, str]:
    return {s.layer: s.key for s in engine_steps(p)}


def test_every_layer_s_packages_install_in_one_step_before_any_layer_s_files() -> None:
    p = plan()
    steps = engine_steps(p)
    assert steps[0].layer == PACKAGE_PHASE and p.install is not None
    script = p.install.apply
    assert script.count("apt-get update") == 1 and script.count("apt-get install") == 1
    for package in ("linux-image-amd64", "prometheus-node-exporter", "ca-certificates"):
        assert f"{package}=" in script, package
    # apt's own configuration is written before the install, and not again by the layer's step
    apt_conf = "/etc/apt/apt.conf.d/90-nodeforge"
    assert apt_conf in {f.path for f in p.install.files}
    assert all(apt_conf not in {f.path for f in s.files} for s in steps[1:])
    assert all(not s.packages and "apt-get install" not in s.apply for s in steps[1:])


def test_a_node_image_defers_the_initramfs_while_packages_install() -> None:
    p = plan()
    assert p.install is not None and "dpkg-divert --local --rename" in p.install.apply and DIVERTED in p.install.apply
    container = plan(image="container-base")
    assert container.install is None or DIVERTED not in container.install.apply


@pytest.mark.parametrize("edit", [Override("sysctl", "swappiness", 7), Override("kernel-args", "iommu", "nopt")])
def test_a_sysctl_or_kernel_argument_edit_changes_only_the_boot_configuration_step(edit: Override) -> None:
    before, after = plan(), plan(edit)
    assert keys(before) == keys(after)  # the package step and every layer's step: all cached
    assert inputs_key(before) == inputs_key(after) and before.layers_key == after.layers_key  # the initramfs too
    assert before.boot is not None and after.boot is not None and before.boot.key != after.boot.key
    assert before.key == before.boot.key and before.key != after.key  # the image's content key moves


def test_the_boot_configuration_step_holds_every_layer_s_sysctl_and_kernel_argument_files() -> None:
    p = plan()
    assert p.boot is not None and p.boot.layer == BOOT_PHASE and not p.boot.apply
    paths = {f.path for f in p.boot.files}
    assert "/etc/sysctl.d/90-nodeforge-sysctl.conf" in paths
    assert {"/etc/nodeforge/kernel-cmdline.d/kernel.conf", "/etc/nodeforge/kernel-cmdline.d/kernel-args.conf"} <= paths
    # written by no layer's own step (no step can see them), and still listed as the layer's files
    assert all(not (paths & {f.path for f in s.files}) for s in engine_steps(p))
    assert "/etc/sysctl.d/90-nodeforge-sysctl.conf" in {f.path for s in p.steps for f in s.files}
    # module options stay in their layer: the initramfs reads them
    assert "/etc/modprobe.d/nodeforge-kernel-args.conf" in {f.path for s in engine_steps(p) for f in s.files}


def test_a_container_image_writes_boot_files_in_their_layer_s_step() -> None:
    container = plan(image="container-base")
    assert container.boot is None and container.key == container.layers_key
    assert all(f.phase != "boot" for s in container.steps for f in s.files)


def test_a_module_option_changes_the_initramfs_but_not_the_packages() -> None:
    before, after = plan(), plan(Override("kernel-args", "blacklist_nouveau", False))
    assert keys(before)[PACKAGE_PHASE] == keys(after)[PACKAGE_PHASE]
    assert inputs_key(before) != inputs_key(after)


def test_a_package_change_changes_the_package_step_and_the_initramfs() -> None:
    before, after = plan(), plan(Override("base", "tools", ["procps", "kmod", "pciutils", "iproute2", "less"]))
    assert keys(before)[PACKAGE_PHASE] != keys(after)[PACKAGE_PHASE]
    assert inputs_key(before) != inputs_key(after)


@pytest.mark.parametrize("path, changes", [("/etc/initramfs-tools/conf.d/x.conf", True),
                                           ("/etc/modprobe.d/x.conf", True),
                                           ("/etc/sysctl.d/x.conf", False),
                                           ("/etc/systemd/system/x.service", False)])
def test_initramfs_inputs_are_the_paths_initramfs_tools_reads(path: str, changes: bool) -> None:
    import dataclasses

    from builder.plan import ContextFile

    p = plan()
    extra = ContextFile(path, "0644", "root", "root", "0" * 64, "test", "x")
    last = p.steps[-1]
    q = dataclasses.replace(p, steps=(*p.steps[:-1], dataclasses.replace(last, files=(*last.files, extra))))
    assert (inputs_key(p) != inputs_key(q)) is changes


def test_packer_applies_each_layer_with_its_own_package_phase() -> None:
    p = plan()
    kernel = next(s for s in p.steps if s.layer == "kernel")
    script = standalone_install(kernel)
    assert "apt-get update" in script and "linux-image-amd64=" in script and "prometheus" not in script
    assert DIVERTED not in script  # a Packer build runs the kernel's own initramfs hooks
