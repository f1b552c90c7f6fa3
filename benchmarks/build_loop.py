"""The build loop of the reference workload, images/node-minimal.yaml with configs/default.yaml
(kernel, systemd, node exporter, sysctl, kernel arguments -> raw, qcow2, netboot):

- cold: empty nodeforge caches (a build directory of its own) and a fresh engine cache of our
  tags (an engine namespace of its own: the mmdebstrap base and every step are built);
- one sysctl value changed (vm.swappiness, a value not built before), after the cold build;
- nothing changed.

Each is the whole `nodeforge build` command, started after a `sync` (the previous build's disk
writes are not the next one's). Where the time went comes from the build's own
progress lines; peak memory is the build process's; the sizes are the outputs'. The figures are
written to build/bench/build-loop.json too, to compare run to run. The namespaced engine tags are
removed afterwards. `python benchmarks/build_loop.py` prints the table; run() returns rows."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (34, 10, 10, 60)
BAR = {"cold": 90.0, "sysctl": 10.0, "noop": 1.0}
GOAL = {"cold": 60.0, "sysctl": 5.0, "noop": 0.5}
_TIMED = re.compile(r"^\[node-minimal\] (.*?)\s+(?:built|cached|reused)?\s*(\d+\.\d)s")
_STAGES = (("base", "base"), ("layer", "layers (engine steps)"), ("initramfs", "initramfs"),
           ("assemble", "assemble"))


def _build(env: dict[str, str], *extra: str) -> tuple[float, str, int]:
    """(seconds, progress lines, peak memory in KiB) of one whole build command."""
    cmd = [sys.executable, "-m", "builder", "build", "images/node-minimal.yaml", "-c", "default", *extra]
    subprocess.run(["sync"], check=False)  # each figure starts on settled storage, not the last one's writes
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        raise SystemExit(f"build failed ({' '.join(extra) or 'no flags'}):\n{p.stderr[-3000:]}")
    peak = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return seconds, p.stderr, peak


def stages(lines: str) -> dict[str, float]:
    """Seconds per stage, summed from the timed progress lines."""
    out: dict[str, float] = {}
    for line in lines.splitlines():
        m = _TIMED.match(line)
        if not m:
            continue
        what = m.group(1)
        stage = next((title for prefix, title in _STAGES if what.startswith(prefix)), None)
        if stage and "waited" not in line:
            out[stage] = round(out.get(stage, 0.0) + float(m.group(2)), 1)
    return out


def _cleanup(namespace: str) -> None:
    for repo in (f"nodeforge-cache-{namespace}", f"nodeforge-base-{namespace}"):
        ids = subprocess.run(["docker", "images", "-q", repo], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rmi", "-f", *sorted(set(ids))], capture_output=True)


def measure() -> dict[str, Any]:
    namespace = f"bench{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="nodeforge-bench-") as build:
        env = {**os.environ, "NODEFORGE_BUILD_DIR": build, "NODEFORGE_CACHE_NAMESPACE": namespace}
        try:
            figures: dict[str, Any] = {}
            edit = ("--set", f"sysctl.swappiness={random.randint(20, 199)}")
            for name, extra in (("cold", ()), ("sysctl", edit), ("noop", edit)):
                seconds, lines, peak = _build(env, *extra)
                figures[name] = {"seconds": round(seconds, 2), "stages": stages(lines), "peak_rss_mib": peak // 1024}
            node = json.loads((Path(build) / "images" / "node-minimal" / "node.json").read_text())
            sizes = {f: (Path(build) / "images" / "node-minimal" / f).stat().st_size for f in node["files"].values()}
        finally:
            _cleanup(namespace)
    return {"image": "node-minimal", "config": "default", "figures": figures, "sizes": sizes,
            "bar": BAR, "goal": GOAL}


def run() -> list[tuple[object, ...]]:
    data = measure()
    out = ROOT / "build" / "bench" / "build-loop.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    rows: list[tuple[object, ...]] = [("figure", "seconds", "bar", "where the time went")]
    titles = {"cold": "cold build, empty caches", "sysctl": "one sysctl value changed", "noop": "nothing changed"}
    for name, title in titles.items():
        f = data["figures"][name]
        met = "met" if f["seconds"] <= BAR[name] else "MISSED"
        rows.append((title, f"{f['seconds']:.2f}", f"<= {BAR[name]:g} {met}",
                     ", ".join(f"{k} {v:.1f}s" for k, v in f["stages"].items()) or "-"))
    rows.append(("peak memory (build process)", f"{max(f['peak_rss_mib'] for f in data['figures'].values())} MiB",
                 "", ""))
    rows.append(("outputs", "", "", ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in data["sizes"].items())))
    rows.append(("written", "", "", str(out.relative_to(ROOT))))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for row in run():
        print("  ".join(f"{c!s:<{w}}" for c, w in zip(row, WIDTHS, strict=False)))
