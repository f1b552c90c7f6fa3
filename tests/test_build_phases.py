"""Build phases in the engine: a value edit rebuilds no package-install step and keeps the
initramfs; a module option regenerates the initramfs, and the booted node sees the option."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from builder.compose import compose
from builder.compose.params import Override, Overrides
from builder.definitions.load import BOOT_PHASE, PACKAGE_PHASE, load_tree
from builder.pipeline import Builder, BuildResult
from builder.progress import Progress
from builder.verify import boot

pytestmark = pytest.mark.engine

LAYER = """\
name: loop-options
summary: An option of the loop module, in modprobe.d and the initramfs (a test layer)
description: >
  Sets max_loop of the loop module and loads the module at boot, so a booted node shows the
  option in /sys/module/loop/parameters.
applies-to: [node]
requires: [kernel]
params:
  max_loop: {type: int, default: 8, min: 1, max: 64, doc: loop devices the module makes when it loads}
kernel:
  modules: [loop]
  modprobe:
    loop:
      max_loop: "{{ max_loop }}"
tests:
  - name: the booted loop module has the option
    scope: boot
    command: {run: cat /sys/module/loop/parameters/max_loop, stdout: {equals: "{{ max_loop }}"}}
"""

IMAGE = """\
name: phase-node
summary: node-minimal with an option of the loop module (a test image)
kind: node
version: "0.1.0"
from:
  debian:
    suite: bookworm
    components: [main, contrib, non-free, non-free-firmware]
source-date-epoch: 1735689600
layers: [base, kernel, sysctl, kernel-args, monitoring, loop-options]
outputs:
  tags: [nodeforge/phase-node:0.1.0]
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("phases")
    for d in ("layers", "images", "configs"):
        shutil.copytree(root / d, tmp / d)
    (tmp / "layers" / "loop-options").mkdir()
    (tmp / "layers" / "loop-options" / "layer.yaml").write_text(LAYER)
    (tmp / "images" / "phase-node.yaml").write_text(IMAGE)
    # node-minimal's lock: the same packages, so the package step is the one the suite has built
    lock = (root / "images" / "node-minimal.lock").read_text()
    (tmp / "images" / "phase-node.lock").write_text(lock.replace("image: node-minimal", "image: phase-node"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)  # its disks: the suite's room is tests/support/disk.py's


def build(tree: Path, *sets: Override) -> BuildResult:
    builder = Builder(load_tree(tree), "default", list(sets), Progress(), formats=["qcow2"])
    return builder.build(["phase-node"])[-1]


def status(result: BuildResult) -> dict[str, str]:
    return {s.layer: s.status for s in result.steps}


def forget(c: docker.DockerClient, tree: Path, sets: Overrides, steps_from: str | None) -> None:
    """Remove what an earlier run left in the engine of a variant: its boot configuration step, its
    initramfs step (unless steps_from is the boot configuration) and its config steps from steps_from
    on (never the package step), so this run sees them built."""
    from builder.compose.phases import boot_step_key, engine_steps
    from builder.engine import initramfs
    from builder.engine.steps import step_ref
    from builder.plan import digest

    plan = compose(load_tree(tree), "phase-node", "default", sets)
    layers = [s.layer for s in engine_steps(plan)]
    tags = ([step_ref(s.key) for s in engine_steps(plan)[layers.index(steps_from):]]
            if steps_from and steps_from != BOOT_PHASE else [])
    final = digest({"content": plan.layers_key, "initramfs": initramfs.inputs_key(plan)})
    if steps_from != BOOT_PHASE:
        tags.append(step_ref(final))
    if plan.boot is not None:  # the boot configuration on that initramfs step
        tags.append(step_ref(boot_step_key(plan, final)))
    for tag in tags:
        try:
            c.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


@pytest.fixture(scope="module")
def builds(tree: Path, docker_client: docker.DockerClient) -> dict[str, BuildResult]:
    first: Overrides = [Override("loop-options", "max_loop", 8)]
    forget(docker_client, tree, first, None)  # so this tree's initramfs cache gets its entry
    results = {"first": build(tree, *first)}
    edited = [*first, Override("sysctl", "swappiness", 7)]  # steps only this test builds
    forget(docker_client, tree, edited, BOOT_PHASE)
    results["sysctl"] = build(tree, *edited)
    option: Overrides = [Override("loop-options", "max_loop", 16)]
    forget(docker_client, tree, option, None)
    results["modprobe"] = build(tree, *option)
    return results


def test_a_sysctl_value_rebuilds_no_package_step_and_keeps_the_initramfs(builds: dict[str, BuildResult]) -> None:
    first, edited = builds["first"], builds["sysctl"]
    assert edited.plan.install is not None and first.plan.install is not None
    assert edited.plan.install.key == first.plan.install.key
    steps = status(edited)
    # every layer's step and the initramfs step cached: only the boot configuration step is built
    assert all(s == "cached" for layer, s in steps.items() if layer != BOOT_PHASE), steps
    assert steps[BOOT_PHASE] == "built", steps
    assert first.initramfs is not None and edited.initramfs is not None
    assert edited.initramfs.key == first.initramfs.key and edited.initramfs.status == "cached", edited.initramfs


def test_a_module_option_regenerates_the_initramfs_and_the_node_boots_with_it(
        builds: dict[str, BuildResult], tree: Path, docker_client: docker.DockerClient) -> None:
    first, changed = builds["first"], builds["modprobe"]
    assert status(changed)[PACKAGE_PHASE] == "cached"
    assert changed.initramfs is not None and first.initramfs is not None
    assert changed.initramfs.key != first.initramfs.key and changed.initramfs.status == "built"
    # the option is inside the new initramfs
    script = ("set -e; unmkinitramfs /boot/initrd.img-* /tmp/i; "
              "find /tmp/i -path '*etc/modprobe.d/nodeforge-loop-options.conf' -exec cat {} +")
    out = docker_client.containers.run(changed.ref, ["sh", "-c", script], remove=True, entrypoint=[]).decode()
    assert "options loop max_loop=16" in out, out
    # and the booted node has it
    assert changed.node is not None
    plan = compose(load_tree(tree), "phase-node", "default", [Override("loop-options", "max_loop", 16)])
    tests = [t for t in plan.tests if t.scope == "boot" and t.layer == "loop-options"]
    assert tests
    outcome = boot.boot(changed.node, "direct", tree / "phase-node-boot.log", tests=tests)
    assert outcome.verdict == "passed", outcome.reason


def test_the_initramfs_is_the_same_when_generated_again(builds: dict[str, BuildResult], tree: Path,
                                                        docker_client: docker.DockerClient) -> None:
    """Generated with the image's SOURCE_DATE_EPOCH: the same inputs give the same bytes."""
    import shutil

    from builder.engine import initramfs
    from builder.engine.steps import step_ref
    from builder.paths import build_dir

    first = builds["first"]
    assert first.initramfs is not None
    cache = build_dir(tree) / "cache" / "initramfs" / first.initramfs.key
    before = {f.name: f.read_bytes() for f in cache.iterdir()}
    shutil.rmtree(cache)
    initramfs._generate(docker_client, step_ref(first.plan.layers_key), first.plan.base.epoch, cache)
    assert {f.name: f.read_bytes() for f in cache.iterdir()} == before
