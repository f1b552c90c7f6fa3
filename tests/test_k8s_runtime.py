"""Kubernetes GPU nodes: the container runtime matches the kubelet, pods cannot pick GPUs by env var
(review C1, C2, C3, K1, K2).

The layers nvidia-container-runtime and k8s-gpu are rendered in a small tree of their own (with a
V100 config, as configs/v100-slurm.yaml has k8s-gpu), and the host's containerd (Debian's 1.6, the
one the image ships) reads the rendered configuration: `containerd config dump` is the effective
CRI configuration, with the drop-in merged as containerd merges it. No engine is needed.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.trees import nodeforge, scratch_image, tree_with_layers

CRI = "io.containerd.grpc.v1.cri"
V100 = "name: v100\nsummary: V100 nodes\nsite:\n  gpu: {model: Tesla V100-SXM2-32GB, count: 4, memory-mib: 32768}\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    image = scratch_image("k8s-node", "a Kubernetes GPU node", ["base", "nvidia-container-runtime", "k8s-gpu"])
    return tree_with_layers(tmp_path, ("base", "kernel", "gpu-present", "nvidia-driver", "nvidia-container-runtime",
                                       "k8s-gpu"),
                            {"k8s-node": image}, {"default": "name: default\nsummary: defaults\n", "v100": V100})


def render(tree: Path, out: Path, *sets: str) -> dict[str, Path]:
    """{layer: its root} of the rendered image."""
    args = [a for s in sets for a in ("--set", s)]
    proc = nodeforge(tree, "render", "k8s-node", str(out), "-c", "v100", *args)
    assert proc.returncode == 0, proc.stderr
    return {p.parent.name.split("-", 1)[1]: p for p in out.glob("*/root")}


def dump(runtime_root: Path, work: Path, with_dropin: bool = True) -> dict[str, Any]:
    """The effective containerd configuration: Debian's containerd reads the rendered main file (and the drop-in)."""
    if shutil.which("containerd") is None:
        pytest.fail("containerd is not installed: run `make setup`")
    conf_d = work / "conf.d"
    conf_d.mkdir(parents=True)
    if with_dropin:
        shutil.copy(runtime_root / "etc/containerd/conf.d/99-nvidia.toml", conf_d / "99-nvidia.toml")
    main = (runtime_root / "etc/containerd/config.toml").read_text()
    (work / "config.toml").write_text(main.replace("/etc/containerd/conf.d", str(conf_d)))
    proc = subprocess.run(["containerd", "--config", str(work / "config.toml"), "config", "dump"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return tomllib.loads(proc.stdout)


# --- C2: containerd's cgroup driver is the kubelet's (systemd) ------------------------------------

def test_c2_effective_cri_runtimes_use_the_systemd_cgroup_driver(tree: Path, tmp_path: Path) -> None:
    roots = render(tree, tmp_path / "render")
    runtime = roots["nvidia-container-runtime"]
    merged = dump(runtime, tmp_path / "merged")["plugins"][CRI]["containerd"]
    assert merged["default_runtime_name"] == "nvidia"
    for name in ("runc", "nvidia"):
        assert merged["runtimes"][name]["runtime_type"] == "io.containerd.runc.v2"
        assert merged["runtimes"][name]["options"]["SystemdCgroup"] is True, name
    assert merged["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # the main file alone (a site that removes the drop-in) says it too
    alone = dump(runtime, tmp_path / "alone", with_dropin=False)["plugins"][CRI]["containerd"]
    assert alone["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    # and the parameter reaches containerd (a cgroupfs kubelet)
    off = render(tree, tmp_path / "render-off", "nvidia-container-runtime.systemd_cgroup=false")
    merged = dump(off["nvidia-container-runtime"], tmp_path / "off")["plugins"][CRI]["containerd"]
    assert merged["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert merged["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is False


# --- C1, C3: the toolkit refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers ----------------

def test_c1_unprivileged_containers_cannot_pick_gpus_by_environment(tree: Path, tmp_path: Path) -> None:
    roots = render(tree, tmp_path / "render")
    config = tomllib.loads((roots["nvidia-container-runtime"] / "etc/nvidia-container-runtime/config.toml").read_text())
    assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert config["accept-nvidia-visible-devices-as-volume-mounts"] is True
    assert config["nvidia-container-runtime"]["mode"] == "auto"
    opened = render(tree, tmp_path / "render-docker", "nvidia-container-runtime.envvar_when_unprivileged=true",
                    "nvidia-container-runtime.mode=jit-cdi")
    config = tomllib.loads((opened["nvidia-container-runtime"] / "etc/nvidia-container-runtime/config.toml")
                           .read_text())
    assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True
    assert config["nvidia-container-runtime"]["mode"] == "jit-cdi"  # C3: the mode is an explicit choice


def test_c1_the_device_plugin_passes_its_list_as_volume_mounts(tree: Path, tmp_path: Path) -> None:
    k8s = render(tree, tmp_path / "render")["k8s-gpu"] / "usr/share/nodeforge/k8s"
    operator = yaml.safe_load((k8s / "gpu-operator-values.yaml").read_text())
    env = {e["name"]: e["value"] for e in operator["devicePlugin"]["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    plugin = yaml.safe_load((k8s / "device-plugin-values.yaml").read_text())
    assert plugin["deviceListStrategy"] == "volume-mounts"
    cdi = render(tree, tmp_path / "render-cdi", "k8s-gpu.device_list_strategy=cdi-annotations")["k8s-gpu"]
    operator = yaml.safe_load((cdi / "usr/share/nodeforge/k8s/gpu-operator-values.yaml").read_text())
    assert {e["name"]: e["value"] for e in operator["devicePlugin"]["env"]}["DEVICE_LIST_STRATEGY"] == "cdi-annotations"
    # the envvar strategy would give pods no GPU on these nodes: not a choice
    proc = nodeforge(tree, "plan", "k8s-node", "-c", "v100", "--set", "k8s-gpu.device_list_strategy=envvar")
    assert proc.returncode == 2 and "k8s-gpu.device_list_strategy" in proc.stderr


# --- K2: a RuntimeClass and GPU Operator values for a node with the driver and toolkit baked in ------

def test_k2_runtime_class_names_containerd_s_nvidia_runtime(tree: Path, tmp_path: Path) -> None:
    roots = render(tree, tmp_path / "render")
    rc = yaml.safe_load((roots["k8s-gpu"] / "usr/share/nodeforge/k8s/runtimeclass-nvidia.yaml").read_text())
    assert (rc["apiVersion"], rc["kind"], rc["metadata"]["name"]) == ("node.k8s.io/v1", "RuntimeClass", "nvidia")
    runtimes = dump(roots["nvidia-container-runtime"], tmp_path / "merged")["plugins"][CRI]["containerd"]["runtimes"]
    assert rc["handler"] in runtimes  # the handler is a runtime containerd knows
    assert rc["scheduling"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_k2_gpu_operator_leaves_the_pre_installed_driver_and_toolkit_alone(tree: Path, tmp_path: Path) -> None:
    k8s = render(tree, tmp_path / "render")["k8s-gpu"] / "usr/share/nodeforge/k8s"
    values = yaml.safe_load((k8s / "gpu-operator-values.yaml").read_text())
    assert values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    assert values["operator"]["defaultRuntime"] == "containerd"


# --- K1: static labels only where GFD and NFD do not own them --------------------------------------

def test_k1_kubelet_sets_only_gpu_present_under_nvidia_com(tree: Path, tmp_path: Path) -> None:
    kubelet = (render(tree, tmp_path / "render")["k8s-gpu"] / "etc/default/kubelet").read_text()
    (line,) = [x for x in kubelet.splitlines() if x.startswith("KUBELET_EXTRA_ARGS=")]
    labels = dict(p.split("=", 1) for p in line.removeprefix("KUBELET_EXTRA_ARGS=--node-labels=").split(","))
    assert labels == {"nvidia.com/gpu.present": "true", "nodeforge.io/gpu.count": "4",
                      "nodeforge.io/gpu.product": "Tesla-V100-SXM2-32GB", "nodeforge.io/gpu.memory": "32768",
                      "nodeforge.io/gpu.family": "volta"}
    site = (render(tree, tmp_path / "render-site", "k8s-gpu.label_prefix=gpu.example.com")["k8s-gpu"]
            / "etc/default/kubelet").read_text()
    assert "gpu.example.com/gpu.product=Tesla-V100-SXM2-32GB" in site


@pytest.mark.parametrize("prefix", ["nvidia.com", "node.kubernetes.io", "k8s.io"])
def test_k1_a_prefix_gfd_or_node_restriction_owns_is_refused(tree: Path, prefix: str) -> None:
    proc = nodeforge(tree, "plan", "k8s-node", "-c", "v100", "--set", f"k8s-gpu.label_prefix={prefix}")
    assert proc.returncode == 2, proc.stdout
    assert "label-prefix-is-the-site-s" in proc.stderr and "Traceback" not in proc.stderr
