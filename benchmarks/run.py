"""`make bench`: the figures the project reports. Timings are measured here, never asserted in tests.

- no-op rebuild of images/node-minimal.yaml (target: under 2 s)
- the build loop of node-minimal: cold, one sysctl value changed, nothing changed; per stage,
  peak memory, output sizes; also as JSON (benchmarks/build_loop.py)
- boot time to verdict per boot mode (benchmarks/boot.py)
- CUDA image sizes against a plain Dockerfile (benchmarks/cuda_sizes.py)
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODEFORGE = [sys.executable, "-m", "builder"]


def noop_rebuild(runs: int = 5) -> list[float]:
    subprocess.run([*NODEFORGE, "build", "images/node-minimal.yaml", "-c", "default", "-q"], cwd=ROOT, check=True)
    times = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run([*NODEFORGE, "build", "images/node-minimal.yaml", "-c", "default", "-q"], cwd=ROOT, check=True,
                       capture_output=True)
        times.append(time.monotonic() - start)
    return times


def main() -> int:
    sys.path.insert(0, str(ROOT))
    times = noop_rebuild()
    med = statistics.median(times)
    print("== no-op rebuild: nodeforge build images/node-minimal.yaml -c default (whole command, warm engine)")
    print(f"   runs {len(times)}: median {med:.2f}s, min {min(times):.2f}s, max {max(times):.2f}s "
          f"(target < 2 s: {'met' if med < 2 else 'MISSED'})")
    for name, title in (("build_loop", "build loop of node-minimal and gpu-node: cold, one sysctl value changed, "
                                      "no change"),
                        ("boot", "boot time to verdict per mode"), ("cuda_sizes", "CUDA image sizes"),
                        ("gpu_health", "GPU health check (Slurm kills it after 60 s; the goal is under 5 s)"),
                        ("fleet_cache", "fleet cache: node-minimal cold, then on an empty second engine, "
                                        "cache warm"),
                        ("fleet_variants", "fleet cache: three gpu-node variants from empty engine caches")):
        try:
            mod = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError:
            continue
        print(f"== {title}")
        rows = mod.run()
        for row in rows:
            widths = getattr(mod, "WIDTHS", None)
            if widths:
                print("   " + "  ".join(f"{c!s:<{w}}" for c, w in zip(row, widths, strict=False)))
            else:
                print("   " + "  ".join(f"{c:>14}" if not isinstance(c, str) else f"{c:<34}" for c in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
