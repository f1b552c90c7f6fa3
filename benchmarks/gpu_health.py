"""The health check a scheduler calls: one run against the healthy 8-GPU H100 fixture (recorded
nvidia-smi, dmesg and scontrol output replayed), against Slurm's 60 s kill limit."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKES = ROOT / "tests" / "fakes" / "bin"
SCENARIO = ROOT / "tests" / "fixtures" / "gpu" / "h100-sxm-8gpu"
CHECK = ROOT / "layers" / "gpu-health" / "files" / "gpu-health.py"
POLICY = ROOT / "layers" / "gpu-health" / "files" / "xid-policy.tsv"
WIDTHS = (44, 12, 12, 12)


def one_run(tmp: Path) -> tuple[float, int]:
    env = {"PATH": f"{FAKES}:/usr/bin:/bin", "FAKE_FIXTURE": str(SCENARIO), "FAKE_LOG": str(tmp / "calls.log"),
           "FAKE_STATE": str(tmp / "state"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(ROOT / "layers" / "node-lib" / "files")}  # the node library, where the node has it
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(CHECK), "--nvidia-smi", str(FAKES / "nvidia-smi"),
                           "--scontrol", str(FAKES / "scontrol"), "--dmesg-command", str(FAKES / "dmesg"),
                           "--xid-policy", str(POLICY), "--expected-gpus", "8", "--fabric", "check",
                           "--node", "node1", "--json"], capture_output=True, text=True, env=env)
    return time.monotonic() - start, proc.returncode


def run(runs: int = 5) -> list[tuple[str, ...]]:
    times, codes = [], set()
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            seconds, code = one_run(Path(tmp))
            times.append(seconds)
            codes.add(code)
    return [("", "median", "max", "exit codes"),
            ("gpu-health, healthy 8 x H100 fixture", f"{statistics.median(times):.2f}s", f"{max(times):.2f}s",
             ",".join(map(str, sorted(codes))))]
