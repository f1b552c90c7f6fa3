"""slurm-gpu's boot-time gres.conf (gpu-review S4): File= from the GPU's minor number, Cores= from its NUMA node.

nodeforge-slurm-gres runs on the recorded DGX H100: its minor numbers come from the recorded `nvidia-smi -q`
(indices 0-7 are minors 2,3,0,1,6,7,4,5), its NUMA nodes from the recorded sysfs tree (GPUs 0-3 on node 0,
4-7 on node 1). A tree where one GPU's numa_node says otherwise moves that GPU's cores with it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.fake_tools import FAKES, fake_tools, overlay

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "layers/slurm-gpu/files/nodeforge-slurm-gres"
GPU = ROOT / "tests/fixtures/gpu/h100-sxm-8gpu"
SYSFS = ROOT / "tests/fixtures/sysfs/h100-sxm-8gpu"
QUERY = r"--query-gpu=index,minor_number,pci\.bus_id --format=csv,noheader"
DGX = ["--node-names", "dgx-h100-[01-32]", "--type", "h100", "--sockets", "2", "--cores-per-socket", "56"]


def recorded_minors() -> str:
    """index, minor_number, pci.bus_id rows as nvidia-smi answers them, from the recorded `nvidia-smi -q`."""
    text = (GPU / "nvidia-smi-q.txt").read_text()
    buses = re.findall(r"(?m)^GPU ([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7])$", text)
    minors = re.findall(r"(?m)^    Minor Number\s+: (\d+)$", text)
    assert len(buses) == len(minors) == 8
    return "".join(f"{i}, {m}, {b}\n" for i, (b, m) in enumerate(zip(buses, minors, strict=True)))


def gres(tmp: Path, *args: str, sysfs: Path = SYSFS, rules: list[dict[str, object]] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], Path]:
    scenario = overlay(tmp, GPU, "nvidia-smi", rules or [{"args": QUERY, "stdout": "minors.csv"}],
                       {"minors.csv": recorded_minors()})
    env, _ = fake_tools(scenario, tmp)
    out = tmp / "etc/slurm/gres.conf"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("AutoDetect=off\n# as built\n")
    proc = subprocess.run([sys.executable, str(PROGRAM), "--config", "/dev/null",
                           "--nvidia-smi", str(FAKES / "nvidia-smi"),
                           "--sysfs-root", str(sysfs), "--output", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    return proc, out


def lines(path: Path) -> list[tuple[str, str]]:
    return re.findall(r"(?m)^NodeName=\S+ Name=gpu Type=h100 File=/dev/nvidia(\d+) Cores=(\S+)$", path.read_text())


def test_s4_device_files_follow_the_minor_numbers_and_cores_the_numa_nodes(tmp_path: Path) -> None:
    proc, out = gres(tmp_path, *DGX)
    assert proc.returncode == 0, proc.stderr
    assert lines(out) == [("2", "0-55"), ("3", "0-55"), ("0", "0-55"), ("1", "0-55"),
                          ("6", "56-111"), ("7", "56-111"), ("4", "56-111"), ("5", "56-111")]
    assert out.read_text().count("AutoDetect=off") == 1


def test_s4_a_gpu_on_the_other_numa_node_gets_that_node_s_cores(tmp_path: Path) -> None:
    tree = tmp_path / "sysfs"
    shutil.copytree(SYSFS, tree, symlinks=True)
    (tree / "bus/pci/devices/0000:1b:00.0/numa_node").write_text("1\n")  # GPU 0 (minor 2) behind socket 1
    (tree / "bus/pci/devices/0000:9d:00.0/numa_node").write_text("-1\n")  # GPU 4: no NUMA node reported
    proc, out = gres(tmp_path / "run", *DGX, sysfs=tree)
    assert proc.returncode == 0, proc.stderr
    found = lines(out)
    assert found[0] == ("2", "56-111") and found[4] == ("6", "56-111")  # -1: the index spread (socket 1)
    assert found[1] == ("3", "0-55")


def test_s4_site_core_lists_and_no_binding(tmp_path: Path) -> None:
    proc, out = gres(tmp_path / "a", *DGX, "--cores", ";".join(["0-27"] * 4 + ["56-83"] * 4))
    assert proc.returncode == 0 and [c for _, c in lines(out)] == ["0-27"] * 4 + ["56-83"] * 4
    proc, out = gres(tmp_path / "b", *DGX, "--bind-cores", "no")
    body = out.read_text().split("AutoDetect=off")[1]
    assert proc.returncode == 0 and "Cores=" not in body and "File=/dev/nvidia2\n" in body


def test_s4_without_an_answer_the_built_file_stays(tmp_path: Path) -> None:
    proc, out = gres(tmp_path, *DGX, rules=[{"args": QUERY, "stdout": "minors.csv", "exit": 9}])
    assert proc.returncode == 0 and "left as built" in proc.stderr
    assert out.read_text() == "AutoDetect=off\n# as built\n"
    bad, _ = gres(tmp_path / "b", "--node-names", "gpu[1-4] Name=x", "--type", "h100")
    assert bad.returncode == 2


def test_s4_the_layer_installs_and_enables_the_writer_with_the_site_s_values() -> None:
    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm", parse_sets([]))
    files = {f.path: f.content for s in plan.steps for f in s.files}
    conf = files["/etc/nodeforge/slurm-gres.conf"] or ""
    assert "node-names = v100-[01-16]\ntype = v100\nsockets = 2\ncores-per-socket = 20\n" in conf
    assert "cores = 0-19;0-19;20-39;20-39\n" in conf and "bind-cores = yes\n" in conf
    unit = files["/etc/systemd/system/nodeforge-slurm-gres.service"] or ""
    assert "Before=slurmd.service" in unit and "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present" in unit
    assert "nodeforge-slurm-gres.service" in [v.value for v in plan.services_enabled]
    assert "/usr/lib/nodeforge/nodeforge-slurm-gres" in files
