"""The cluster layers composed by configs/v100-slurm.yaml: slurm-gpu, infiniband, k8s-gpu, io-tuning.

What each layer writes for the V100 Slurm nodes, the asserts that refuse wrong values (one
deliberately wrong parameter per layer), the layers' own file tests failing against files
rendered with another value (the nvidia-peermem loader: tests/test_infiniband_rdma.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest
from support.offline import build_offline_sources, offline_sets, serve
from support.reports import assert_all_passed, report_of_test

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError
from builder.plan import BuildPlan

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("slurm-gpu", "infiniband", "k8s-gpu", "io-tuning")
PEERMEM_LOAD = ROOT / "layers/infiniband/files/nvidia-peermem-load"

# every key cgroup.conf(5) of Slurm 22.05.8 (bookworm's slurmd) documents; any other key is fatal to slurmd
CGROUP_CONF_22_05 = {
    "AllowedKmemSpace", "AllowedRAMSpace", "AllowedSwapSpace", "CgroupAutomount", "CgroupMountpoint",
    "CgroupPlugin", "ConstrainCores", "ConstrainDevices", "ConstrainKmemSpace", "ConstrainRAMSpace",
    "ConstrainSwapSpace", "IgnoreSystemd", "IgnoreSystemdOnFailure", "MaxKmemPercent", "MaxRAMPercent",
    "MaxSwapPercent", "MemorySwappiness", "MinKmemSpace", "MinRAMSpace",
}


def plan_of(tree: Any, *sets: str, image: str = "node-minimal", config: str = "v100-slurm") -> BuildPlan:
    return compose(tree, image, config, parse_sets(list(sets)))


def files_of(plan: BuildPlan) -> dict[str, str]:
    return {f.path: f.content for step in plan.steps for f in step.files if f.content is not None}


def problems(tree: Any, *sets: str) -> list[str]:
    with pytest.raises(DefinitionError) as e:
        plan_of(tree, *sets)
    return [f"{p.file} {p.path}: {p.message}" for p in e.value.problems]


def content_failures(plan: BuildPlan, files: dict[str, str], layer: str) -> list[str]:
    """Run the layer's image-scope file-content checks of `plan` against rendered `files`."""
    failed = []
    for t in plan.tests:
        if t.layer != layer or t.kind != "file" or "content" not in t.spec or t.spec["path"] not in files:
            continue
        text, m = files[t.spec["path"]], t.spec["content"]
        ok = (all(s in text for s in m.get("contains", [])) and not any(s in text for s in m.get("not-contains", []))
              and (m.get("matches") is None or re.search(m["matches"], text) is not None)
              and (m.get("equals") is None or text.strip() == m["equals"]))
        if not ok:
            failed.append(t.name)
    return failed


# --- what configs/v100-slurm.yaml gives a node -------------------------------------------------

def test_v100_slurm_adds_the_cluster_layers_to_node_images_only(tree: Any) -> None:
    node = plan_of(tree)
    layers = [s.layer for s in node.steps]
    assert set(LAYERS) <= set(layers) and "gpu-health" in layers and "numa-topology" in layers
    assert "slurmd" in node.packages and "rdma-core" in node.packages and "perftest" in node.packages
    container = compose(tree, "container-base", "v100-slurm")
    assert not set(LAYERS) & {s.layer for s in container.steps}


def test_gres_conf_has_one_explicit_line_per_v100_with_its_sockets_cores(tree: Any) -> None:
    gres = files_of(plan_of(tree))["/etc/slurm/gres.conf"]
    lines = [line for line in gres.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "AutoDetect=off",
        "NodeName=v100-[01-16] Name=gpu Type=v100 File=/dev/nvidia0 Cores=0-19",
        "NodeName=v100-[01-16] Name=gpu Type=v100 File=/dev/nvidia1 Cores=0-19",
        "NodeName=v100-[01-16] Name=gpu Type=v100 File=/dev/nvidia2 Cores=20-39",
        "NodeName=v100-[01-16] Name=gpu Type=v100 File=/dev/nvidia3 Cores=20-39",
    ]


def test_slurm_conf_fragment_and_cgroup_conf(tree: Any) -> None:
    files = files_of(plan_of(tree))
    fragment = files["/etc/slurm/nodeforge-gpu-nodes.conf"]
    assert "\nGresTypes=gpu\n" in fragment
    assert ("\nNodeName=v100-[01-16] Sockets=2 CoresPerSocket=20 ThreadsPerCore=2 RealMemory=380000 "
            "Gres=gpu:v100:4 State=UNKNOWN\n") in fragment
    cgroup = dict(line.split("=", 1) for line in files["/etc/slurm/cgroup.conf"].splitlines()
                  if line and not line.startswith("#"))
    assert cgroup["ConstrainDevices"] == "yes" and cgroup["CgroupPlugin"] == "autodetect"
    assert set(cgroup) <= CGROUP_CONF_22_05, set(cgroup) - CGROUP_CONF_22_05
    # no controller configured: slurm.conf is left to provisioning, slurmd waits for it and the munge key
    assert "SlurmctldHost" not in files["/etc/slurm/nodeforge-cluster.conf"]
    join = files["/etc/systemd/system/slurmd.service.d/nodeforge-join.conf"]
    assert "ConditionPathExists=/etc/munge/munge.key" in join
    assert "slurmd.service" in [v.value for v in plan_of(tree).services_enabled]


def test_a_controller_gives_a_complete_minimal_slurm_conf(tree: Any) -> None:
    conf = files_of(plan_of(tree, "slurm-gpu.controller=ctl1"))["/etc/slurm/nodeforge-cluster.conf"]
    for line in ("SlurmctldHost=ctl1", "include /etc/slurm/nodeforge-gpu-nodes.conf", "ProctrackType=proctrack/cgroup",
                 "TaskPlugin=task/cgroup,task/affinity", "PartitionName=gpu Nodes=v100-[01-16] Default=YES"):
        assert f"\n{line}" in conf, line


def test_cores_from_the_topology_and_type_from_the_model(tree: Any) -> None:
    # no explicit cores: GPUs spread over the sockets in index order, each gets its socket's logical cores
    gres = files_of(plan_of(tree, "slurm-gpu.cores=null", "slurm-gpu.gpu_type="))["/etc/slurm/gres.conf"]
    assert re.findall(r"Type=(\S+) File=(/dev/nvidia\d) Cores=(\S+)", gres) == [
        ("v100", "/dev/nvidia0", "0-19"), ("v100", "/dev/nvidia1", "0-19"),
        ("v100", "/dev/nvidia2", "20-39"), ("v100", "/dev/nvidia3", "20-39")]
    unbound = files_of(plan_of(tree, "slurm-gpu.bind_cores=false"))["/etc/slurm/gres.conf"]
    body = unbound.split("AutoDetect=off")[1]
    assert "Cores=" not in body and body.count("Name=gpu Type=v100 File=/dev/nvidia") == 4


def test_infiniband_limits_modules_peermem_and_ipoib(tree: Any) -> None:
    plan = plan_of(tree)
    files = files_of(plan)
    limits = files["/etc/security/limits.d/90-nodeforge-rdma.conf"]
    assert "* soft memlock unlimited" in limits and "* hard memlock unlimited" in limits
    assert "\nDefaultLimitMEMLOCK=infinity\n" in files["/etc/systemd/system.conf.d/90-nodeforge-rdma.conf"]
    assert [v.value for v in plan.modules if v.value in ("ib_umad", "rdma_ucm")] == ["ib_umad", "rdma_ucm"]
    assert not any("peermem" in str(v.value) for v in plan.modules)  # never modules-load.d: no driver, failed boot
    ipoib = files["/etc/udev/rules.d/70-nodeforge-ipoib.rules"]
    assert 'ATTR{type}=="32", ATTR{mode}="datagram", ATTR{mtu}="4092"' in ipoib
    unit = (ROOT / "layers/infiniband/files/nodeforge-nvidia-peermem.service").read_text()
    assert "After=rdma-hw.target" in unit and "WantedBy=rdma-hw.target" in unit
    assert "ExecCondition=/usr/lib/nodeforge/nvidia-peermem-load --check" in unit
    connected = files_of(plan_of(tree, "infiniband.ipoib_mode=connected", "infiniband.ipoib_mtu=65520",
                                 "infiniband.ipoib_enhanced=false"))
    assert 'ATTR{mode}="connected", ATTR{mtu}="65520"' in connected["/etc/udev/rules.d/70-nodeforge-ipoib.rules"]


def test_kubelet_labels_as_gpu_feature_discovery_names_them(tree: Any) -> None:
    kubelet = files_of(plan_of(tree))["/etc/default/kubelet"]
    assert ('\nKUBELET_EXTRA_ARGS=--node-labels=nvidia.com/gpu.present=true,nodeforge.io/gpu.count=4,'
            'nodeforge.io/gpu.product=Tesla-V100-SXM2-32GB,nodeforge.io/gpu.memory=32768,nodeforge.io/gpu.family=volta\n'
            ) in kubelet
    extra = files_of(plan_of(tree, 'k8s-gpu.extra_labels=["example.com/rack=r12"]',
                             "k8s-gpu.extra_args=--max-pods=200"))
    assert "nodeforge.io/gpu.family=volta,example.com/rack=r12 --max-pods=200'" in extra["/etc/default/kubelet"]


def test_kubelet_product_drops_what_gfd_drops(scratch_tree: Path) -> None:
    cfg = (scratch_tree / "configs/v100-slurm.yaml").read_text()
    (scratch_tree / "configs/v100-slurm.yaml").write_text(
        cfg.replace("model: Tesla V100-SXM2-32GB", "model: 'NVIDIA H100 80GB HBM3 (SXM5)'"))
    kubelet = files_of(plan_of(load_tree(scratch_tree)))["/etc/default/kubelet"]
    assert "nodeforge.io/gpu.product=NVIDIA-H100-80GB-HBM3-SXM5," in kubelet
    assert "nodeforge.io/gpu.family=hopper" in kubelet


def test_nvme_rule_and_scratch_settings(tree: Any) -> None:
    files = files_of(plan_of(tree, 'io-tuning.scratch_disks=["/dev/md0"]'))
    rule = files["/etc/udev/rules.d/60-nodeforge-nvme.rules"]
    assert 'KERNEL=="nvme[0-9]*n[0-9]*", ENV{DEVTYPE}=="disk", ATTR{queue/scheduler}="none", ' \
           'ATTR{queue/read_ahead_kb}="1024"' in rule
    conf = files["/etc/nodeforge/scratch-disks.conf"]
    # IO1: no stride guess, mkfs.ext4 reads the md array's geometry (0 = from the device)
    assert 'SCRATCH_DISKS="/dev/md0"' in conf and "SCRATCH_STRIDE=0\n" in conf and "SCRATCH_STRIPE_WIDTH=0\n" in conf


# --- one deliberately wrong parameter per layer is refused, with the reason -------------------

@pytest.mark.parametrize(("sets", "rule", "says"), [
    (["slurm-gpu.autodetect=nvml"], "no-nvml-autodetect-on-bookworm", "slurm-wlm-nvml-plugin"),
    (['slurm-gpu.cores=null', 'slurm-gpu.cores=["0-19", "0-19", "20-39"]'],
     "one-core-list-per-gpu", "3 entries for 4 GPUs"),
    (['slurm-gpu.cores=null', 'slurm-gpu.cores=["0-19,40-59", "0-19", "20-39", "20-39"]'],
     "cores-are-logical-indices", "not OS CPU numbers"),
    (["slurm-gpu.gpu_type=", "slurm-gpu.node_names=gpu[1-4"], "node_names", "expected a value matching"),
    (["infiniband.ipoib_mtu=65520"], "ipoib-mtu-fits-mode", "needs connected mode"),
    (['infiniband.boot_modules=["ib_umad; reboot"]'], "modules-are-module-names", "kernel module names"),
    (["k8s-gpu.family=Ada Lovelace"], "labels-follow-kubernetes-grammar", '"nodeforge.io/gpu.family=Ada Lovelace"'),
    (['k8s-gpu.extra_labels=["example.com/rack=-r12"]'], "labels-follow-kubernetes-grammar", "example.com/rack=-r12"),
    (["io-tuning.scratch_stride=16", "io-tuning.scratch_stripe_width=60"], "stripe-width-is-stride-times-disks",
     "not a multiple of scratch_stride 16"),
    (['io-tuning.scratch_disks=["sdb"]'], "scratch-disks-are-devices", "other than /dev paths"),
])
def test_a_wrong_value_is_refused_with_its_reason(tree: Any, sets: list[str], rule: str, says: str) -> None:
    found = problems(tree, *sets)
    assert any(rule in p and says in p for p in found), found


def test_slurm_gpu_needs_the_site_gpu_count(scratch_tree: Path) -> None:
    cfg = (scratch_tree / "configs/v100-slurm.yaml").read_text()
    (scratch_tree / "configs/v100-slurm.yaml").write_text(cfg.replace("count: 4", "count: 0"))
    with pytest.raises(DefinitionError) as e:
        plan_of(load_tree(scratch_tree))
    assert any("gpu-count-known" in p.path and "site.gpu.count is 0" in p.message for p in e.value.problems)


def test_the_remedy_of_each_refusal_composes(tree: Any) -> None:
    plan_of(tree, "infiniband.ipoib_mode=connected", "infiniband.ipoib_mtu=65520", "infiniband.ipoib_enhanced=false",
            "io-tuning.scratch_stride=16", "io-tuning.scratch_stripe_width=48",
            "k8s-gpu.family=ada-lovelace", 'io-tuning.scratch_disks=["/dev/disk/by-id/nvme-X_1", "/dev/md0"]')


# --- the layers' own tests fail against files rendered with another value ------------------------

@pytest.mark.parametrize(("layer", "sets"), [
    ("slurm-gpu", ["slurm-gpu.cores_per_socket=24", "slurm-gpu.cores=null"]),
    ("infiniband", ["infiniband.memlock=65536"]),
    ("infiniband", ["infiniband.ipoib_mtu=2044"]),
    ("io-tuning", ["io-tuning.read_ahead_kb=4096"]),
    ("io-tuning", ["io-tuning.nvme_scheduler=mq-deadline"]),
])
def test_layer_file_tests_fail_on_a_wrong_value(tree: Any, layer: str, sets: list[str]) -> None:
    right = plan_of(tree)
    assert content_failures(right, files_of(right), layer) == []
    other = plan_of(tree, *sets)
    assert content_failures(other, files_of(right), layer), f"{layer}: no test noticed {sets}"


def test_k8s_file_test_fails_for_another_gpu_count(scratch_tree: Path) -> None:
    cfg = (scratch_tree / "configs/v100-slurm.yaml").read_text()
    (scratch_tree / "configs/v8.yaml").write_text(
        cfg.replace("name: v100-slurm", "name: v8").replace("count: 4", "count: 8")
        .replace('cores: ["0-19", "0-19", "20-39", "20-39"]', "cores: []"))
    tree = load_tree(scratch_tree)
    four, eight = plan_of(tree), plan_of(tree, config="v8")
    failed = content_failures(eight, files_of(four), "k8s-gpu")
    assert failed == ["kubelet gets the GPU labels from /etc/default/kubelet"]
    assert content_failures(eight, files_of(four), "slurm-gpu")  # the fragment says gpu:v100:4


# --- the nvidia-peermem loader: tests/test_infiniband_rdma.py (recorded modinfo, modversions and kallsyms) --

def test_shipped_shell_scripts_are_shellcheck_clean() -> None:
    scripts = [PEERMEM_LOAD, ROOT / "layers/io-tuning/files/scratch-format"]
    p = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_dgx_h100_with_slurm_and_infiniband(scratch_tree: Path) -> None:
    """The lines configs/dgx-h100.yaml takes for Slurm and InfiniBand compose to eight H100 lines,
    four GPUs per 56-core socket, with the type derived from the model name."""
    import yaml

    path = scratch_tree / "configs/dgx-h100.yaml"
    if not path.exists():
        pytest.skip("configs/dgx-h100.yaml is not in the tree")
    cfg = yaml.safe_load(path.read_text())
    cfg["layers"] = {"node": [*cfg.get("layers", {}).get("node", []), "slurm-gpu", "infiniband"]}
    cfg["layers"]["node"] = list(dict.fromkeys(cfg["layers"]["node"]))
    cfg.setdefault("params", {})["slurm-gpu"] = {
        "node_names": "dgx-h100-[01-32]", "sockets": 2, "cores_per_socket": 56, "threads_per_core": 2,
        "real_memory_mib": 2000000}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    files = files_of(plan_of(load_tree(scratch_tree), config="dgx-h100"))
    cores = re.findall(r"Type=(\w+) File=/dev/nvidia(\d) Cores=(\S+)", files["/etc/slurm/gres.conf"])
    assert cores == [("h100", str(i), "0-55" if i < 4 else "56-111") for i in range(8)]
    assert "Gres=gpu:h100:8 " in files["/etc/slurm/nodeforge-gpu-nodes.conf"]
    assert "* hard memlock unlimited" in files["/etc/security/limits.d/90-nodeforge-rdma.conf"]


# --- gpu-node built with configs/v100-slurm.yaml boots with every boot-scope check passing ---------

@pytest.fixture(scope="session")
def v100_report(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient) -> dict[str, Any]:
    """gpu-node -c v100-slurm, built in a copy of the tree under its own tag (the default build keeps
    nodeforge/gpu-node), with the stand-in container toolkit (tests/support/offline.py), then
    tested with a direct boot: the JSON report."""
    tree = tmp_path_factory.mktemp("v100-tree")
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tree / d)
    image = tree / "images/gpu-node.yaml"
    image.write_text(image.read_text().replace("nodeforge/gpu-node:0.1.0",
                                               "nodeforge-test/gpu-node-v100-slurm:0.1.0"))
    offline = tmp_path_factory.mktemp("v100-offline")
    build_offline_sources(offline)
    with serve(offline, port=0) as base:
        cli = [sys.executable, "-m", "builder.cli", "--root", str(tree)]
        sets = offline_sets(base)[:4]  # the toolkit's: a V100 node has no fabric manager
        built = subprocess.run([*cli, "build", "gpu-node", "-c", "v100-slurm", *sets],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-6000:]
        report = report_of_test(cli, "gpu-node", tmp_path_factory.mktemp("v100-report"), "-c", "v100-slurm", *sets,
                                "--boot-modes", "direct")
    # its disks (7 GB): the report is what the tests read; the output tag goes too (its steps stay cached)
    shutil.rmtree(tree, ignore_errors=True)
    for tagged in docker_client.images.list(name="nodeforge-test/gpu-node-v100-slurm"):
        for tag in tagged.tags:
            docker_client.api.remove_image(tag)
    return report


@pytest.mark.docker
@pytest.mark.slow
def test_gpu_node_with_v100_slurm_boots_with_every_check_passing(v100_report: dict[str, Any]) -> None:
    assert_all_passed(v100_report)
    for layer in LAYERS:
        ran = [r for r in v100_report["results"] if r["layer"] == layer]
        assert ran and all(r["status"] == "passed" for r in ran), (layer, ran)
        if layer != "k8s-gpu":  # k8s-gpu only writes a file: it has no boot-scope check
            assert any(r["scope"] == "boot" for r in ran), layer
