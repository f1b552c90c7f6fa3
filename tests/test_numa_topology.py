"""nodeforge-numa-probe (layers/numa-topology) on recorded `nvidia-smi topo -m` output (tab-separated, with its
terminal escape codes) and sysfs trees: an 8 x H100 node with a NIC per GPU, a single-GPU node, and a badly wired
node whose only NIC hangs off the other socket for two of its GPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.fake_tools import fake, fake_tools
from support.metrics import assert_promtool_accepts
from support.programs import load_program
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "layers" / "numa-topology" / "files" / "numa-probe.py"
FIXTURES = ROOT / "tests" / "fixtures"
SYSFS = FIXTURES / "sysfs"
SCENARIOS = {"h100-sxm-8gpu": FIXTURES / "gpu" / "h100-sxm-8gpu", "a100-pcie-1gpu": FIXTURES / "gpu" / "a100-pcie-1gpu",
             "topo-bad-wiring": FIXTURES / "topo-bad-wiring",
             "h100-sxm-8gpu-535": FIXTURES / "gpu" / "h100-sxm-8gpu-535"}


def probe(tmp: Path, machine: str, *args: str, nvidia_smi: str | None = None,
          sysfs: str | None = None) -> tuple[int, dict[str, Any], list[list[str]]]:
    env, calls = fake_tools(SCENARIOS[machine], tmp)
    tree = SCENARIOS[machine] / "sysfs" if (SCENARIOS[machine] / "sysfs").is_dir() else SYSFS / (sysfs or machine)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nvidia-smi", nvidia_smi or fake("nvidia-smi"),
                           "--sysfs-root", str(tree), "--json", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.stderr == "", proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, doc, calls.argv()


def test_topo_output_carries_escape_codes_and_tabs() -> None:
    # the recording is what nvidia-smi prints to a terminal: the parser must cope with both
    raw = (SCENARIOS["h100-sxm-8gpu"] / "topo-m.txt").read_text()
    assert raw.startswith("\t\x1b[4mGPU0\t") and "GPU NUMA ID\x1b[0m\n" in raw
    topo = load_program(SCRIPT).parse_topo(raw)
    assert topo.paths["GPU0"]["NIC0"] == "PIX" and topo.paths["GPU0"]["GPU7"] == "NV18"
    assert topo.paths["GPU3"]["NIC4"] == "SYS" and topo.paths["NIC7"]["NIC7"] == "X"
    assert topo.affinity["GPU5"] == ("56-111,168-223", "1")
    assert topo.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}


def test_h100_node_pairs_every_gpu_with_its_own_nic(tmp_path: Path) -> None:
    rc, doc, calls = probe(tmp_path, "h100-sxm-8gpu")
    assert rc == 0 and doc["status"] == "OK" and doc["warnings"] == []
    assert [(g["index"], g["closest_nic"], g["closest_path"]) for g in doc["gpus"]] == [
        (i, f"mlx5_{i}", "PIX") for i in range(8)]
    assert [g["numa_node"] for g in doc["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["socket"] for g in doc["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert doc["gpus"][4]["cpu_affinity"] == "56-111,168-223" and doc["gpus"][4]["bus_id"] == "0000:9d:00.0"
    nic = doc["nics"][2]
    assert (nic["name"], nic["bus_id"], nic["numa_node"], nic["netdevs"]) == ("mlx5_2", "0000:4f:00.0", 0,
                                                                              ["ibp79s0"])
    assert calls == [["--query-gpu=index,pci.bus_id", "--format=csv,noheader"], ["topo", "-m"]]


def test_single_gpu_node_without_nics(tmp_path: Path) -> None:
    rc, doc, _ = probe(tmp_path, "a100-pcie-1gpu")
    assert rc == 0 and doc["nics"] == [] and doc["warnings"] == []
    (gpu,) = doc["gpus"]
    assert (gpu["bus_id"], gpu["numa_node"], gpu["cpu_affinity"], gpu["closest_nic"]) == (
        "0000:41:00.0", 0, "0-31,64-95", None)


def test_badly_wired_node_warns_for_the_cross_socket_gpus(tmp_path: Path) -> None:
    rc, doc, _ = probe(tmp_path, "topo-bad-wiring")
    assert rc == 1 and doc["status"] == "WARNING" and doc["cross_socket_gpus"] == 2
    assert [g["cross_socket"] for g in doc["gpus"]] == [True, True, False, False]
    assert len(doc["warnings"]) == 2
    assert doc["warnings"][0].startswith("GPU 0 (0000:17:00.0) on socket 0: its closest NIC mlx5_0 (SYS) is on "
                                         "socket 1")
    assert doc["gpus"][2]["closest_path"] == "PIX"


def test_sysfs_alone_finds_the_cross_socket_pairs(tmp_path: Path) -> None:
    rc, doc, _ = probe(tmp_path, "topo-bad-wiring", nvidia_smi=str(tmp_path / "absent"))
    assert rc == 1 and doc["gpu_source"] == "sysfs"
    assert [g["bus_id"] for g in doc["gpus"]] == ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]
    assert [g["cross_socket"] for g in doc["gpus"]] == [True, True, False, False]


def test_topology_from_a_file(tmp_path: Path) -> None:
    rc, doc, calls = probe(tmp_path, "topo-bad-wiring", "--topo-file",
                           str(SCENARIOS["topo-bad-wiring"] / "topo-m.txt"))
    assert rc == 1 and doc["cross_socket_gpus"] == 2 and ["topo", "-m"] not in calls


def test_firmware_without_numa_node_warns(tmp_path: Path) -> None:
    tree = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "a100-pcie-1gpu", tree, symlinks=True)
    (tree / "bus/pci/devices/0000:41:00.0/numa_node").write_text("-1\n")
    rc, doc, _ = probe(tmp_path, "a100-pcie-1gpu", "--sysfs-root", str(tree))
    assert rc == 1 and "reports no NUMA node" in doc["warnings"][0]


def test_node_without_gpu_or_nvidia_smi_is_fine(tmp_path: Path) -> None:
    empty = tmp_path / "sys"
    empty.mkdir()
    rc, doc, _ = probe(tmp_path, "a100-pcie-1gpu", "--sysfs-root", str(empty), nvidia_smi=str(tmp_path / "absent"))
    assert rc == 0 and doc["gpus"] == [] and "no NVIDIA GPU found" in doc["notes"]


def test_json_record_and_textfile_metric(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, doc, _ = probe(tmp_path, "topo-bad-wiring", "--output", str(out / "numa-topology.json"),
                       "--textfile", str(out))
    assert rc == 1
    assert json.loads((out / "numa-topology.json").read_text()) == doc
    prom = (out / "numa_topology.prom").read_text()
    assert "nodeforge_numa_cross_socket_gpus 2\n" in prom
    assert 'nodeforge_numa_gpu_nic_cross_socket{gpu="0",nic="mlx5_0",path="SYS"} 1\n' in prom
    assert 'nodeforge_numa_gpu_nic_cross_socket{gpu="2",nic="mlx5_0",path="PIX"} 0\n' in prom
    assert 'nodeforge_numa_gpu_numa_node{gpu="3",bus_id="0000:ca:00.0"} 1\n' in prom
    assert_promtool_accepts(prom)


# --- the layer: the boot unit's command line drives the probe ------------------------------------------------------

SCRATCH_IMAGE = scratch_image("numa-scratch", "a node with the numa-topology layer", ["base", "numa-topology"])


def test_boot_unit_runs_the_probe_with_valid_options(tmp_path: Path) -> None:
    tree = tree_with_layers(tmp_path, ("base", "node-lib", "numa-topology"), {"numa-scratch": SCRATCH_IMAGE})
    out = tmp_path / "render"
    proc = nodeforge(tree, "render", "numa-scratch", str(out))
    assert proc.returncode == 0, proc.stderr
    unit = next(out.glob("*-numa-topology/root/etc/systemd/system/nodeforge-numa-probe.service")).read_text()
    (exec_start,) = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = exec_start.split()
    assert argv[0] == "/usr/sbin/nodeforge-numa-probe" and "SuccessExitStatus=1" in unit
    # the unit's own options, with its output paths moved into the test's directory
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--output"] == "/run/nodeforge/numa-topology.json"
    options.update({"--output": str(tmp_path / "numa.json"), "--textfile": str(tmp_path)})
    env, _ = fake_tools(SCENARIOS["topo-bad-wiring"], tmp_path)
    run = subprocess.run([sys.executable, str(SCRIPT), *[x for kv in options.items() for x in kv],
                          "--nvidia-smi", fake("nvidia-smi"), "--sysfs-root", str(SYSFS / "topo-bad-wiring")],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 1 and "WARNING GPU 0 (0000:17:00.0)" in run.stdout
    assert json.loads((tmp_path / "numa.json").read_text())["cross_socket_gpus"] == 2


# --- a DGX H100: eight compute ports and four storage / in-band ports (DGX H100 User Guide) -----------

DGX_COMPUTE = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
DGX_STORAGE = ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]


def test_dgx_h100_topo_names_twelve_nics_as_the_user_guide_does() -> None:
    topo = load_program(SCRIPT).parse_topo((SCENARIOS["h100-sxm-8gpu-535"] / "topo-m.txt").read_text())
    assert topo.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(12)}
    assert [next(n for n, p in topo.paths[f"GPU{g}"].items() if p == "PIX") for g in range(8)] == \
        [f"NIC{int(name.split('_')[1])}" for name in DGX_COMPUTE]
    assert topo.paths["NIC1"]["NIC2"] == "PIX" and topo.paths["GPU0"]["NIC1"] == "NODE"


def test_dgx_h100_pairs_gpus_with_compute_nics_and_reports_storage_nics(tmp_path: Path) -> None:
    rc, doc, _ = probe(tmp_path, "h100-sxm-8gpu-535")
    assert rc == 0 and doc["status"] == "OK" and doc["warnings"] == [], doc
    assert [(g["index"], g["closest_nic"], g["closest_path"]) for g in doc["gpus"]] == \
        [(i, name, "PIX") for i, name in enumerate(DGX_COMPUTE)]
    roles = {n["name"]: n["role"] for n in doc["nics"]}
    assert sorted(n for n, r in roles.items() if r == "storage") == sorted(DGX_STORAGE)
    assert sorted(n for n, r in roles.items() if r == "compute") == sorted(DGX_COMPUTE)
    assert "storage / in-band NICs (not paired with a GPU): mlx5_1, mlx5_2, mlx5_7, mlx5_8" in doc["notes"]


def test_a_gpu_without_its_compute_nic_is_never_paired_with_a_storage_nic(tmp_path: Path) -> None:
    """Named compute NICs: GPU 0's own port (mlx5_0) left out of the list, a storage port on the same socket
    (NODE) is still never its closest NIC; another compute port of its socket is."""
    rc, doc, _ = probe(tmp_path, "h100-sxm-8gpu-535", "--compute-nics", ",".join(DGX_COMPUTE[1:]))
    gpu0 = doc["gpus"][0]
    assert gpu0["closest_nic"] in DGX_COMPUTE[1:4] and gpu0["closest_path"] == "NODE"
    assert {n["name"]: n["role"] for n in doc["nics"]}["mlx5_0"] == "storage"
    assert rc == 0 and all(g["closest_nic"] not in DGX_STORAGE for g in doc["gpus"])


def test_compute_nics_reach_the_boot_unit(tmp_path: Path) -> None:
    image = scratch_image("numa-dgx", "a DGX node", ["base", {"numa-topology": {"compute_nics": DGX_COMPUTE}}])
    tree = tree_with_layers(tmp_path, ("base", "node-lib", "numa-topology"), {"numa-dgx": image})
    out = tmp_path / "render"
    proc = nodeforge(tree, "render", "numa-dgx", str(out))
    assert proc.returncode == 0, proc.stderr
    unit = next(out.glob("*-numa-topology/root/etc/systemd/system/nodeforge-numa-probe.service")).read_text()
    assert f"--compute-nics {','.join(DGX_COMPUTE)}" in unit
