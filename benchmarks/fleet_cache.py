"""The fleet cache (builder.fleetcache): node-minimal (configs/default.yaml) built cold on an empty
engine, then on a second, empty engine (its own dockerd, tests/support/second_engine.py) with the
registry cache warm. The goal: the warm build at most 10 % of the cold one.

- cold: this machine's engine, an engine namespace and build directory of its own, an empty base
  tarball cache: the mmdebstrap base and every step built; no cache (what every machine paid
  before the fleet cache: the commit before it had none, so this is also its figure);
- push: the same build again with --cache and the signing key: every entry pushed, signed;
- warm: the second engine, empty, its own build directory and base cache, --cache with the public
  key: every keyed image pulled and verified, the node assembled here (the assembly's outputs are
  not cache entries: they are made from the pulled image).

Bytes are the compressed layer bytes the engines moved (layers already there are not counted).
Written to build/bench/fleet-cache.json; the ratio to the previous run's figures is printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (44, 12, 16, 50)
GOAL_RATIO = 0.10
_FIGURES = re.compile(r"cache \S+: (\d+) pulled \(([\d.]+) MB\), (\d+) pushed \(([\d.]+) MB\), (\d+) refused")


def _build(env: dict[str, str], *extra: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "builder", "build", "node-minimal", "-c", "default", *extra]
    subprocess.run(["sync"], check=False)
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        raise SystemExit(f"build failed ({' '.join(extra)}):\n{p.stderr[-3000:]}")
    return seconds, p.stderr


def cache_figures(lines: str) -> dict[str, float]:
    """The figures a build with --cache ends with (its `cache ...: N pulled ...` line)."""
    m = _FIGURES.search(lines)
    if not m:
        return {}
    return {"pulled": int(m.group(1)), "mb_pulled": float(m.group(2)), "pushed": int(m.group(3)),
            "mb_pushed": float(m.group(4)), "refused": int(m.group(5))}


def measure() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.engine import remove_namespace
    from support.registry import signed_cache
    from support.second_engine import second_engine

    from benchmarks.build_loop import stages

    namespace = f"benchfleet{os.getpid()}"
    figures: dict[str, Any] = {}
    with signed_cache("nodeforge-bench-fleet-") as (tmp, key, pub, cache):
        try:
            env = {**os.environ, "NODEFORGE_BUILD_DIR": str(tmp / "a"), "NODEFORGE_CACHE_NAMESPACE": namespace,
                   "NODEFORGE_CACHE": str(tmp / "a-host-cache")}
            seconds, _ = _build(env)
            figures["cold"] = {"seconds": round(seconds, 2)}
            seconds, lines = _build(env, "--cache", cache, "--secret", f"cache-signing={key}")
            figures["push"] = {"seconds": round(seconds, 2), **cache_figures(lines)}
            with second_engine(tmp) as engine:
                env_b = {**env, "DOCKER_HOST": engine, "NODEFORGE_BUILD_DIR": str(tmp / "b"),
                         "NODEFORGE_CACHE": str(tmp / "b-host-cache")}
                seconds, lines = _build(env_b, "--cache", cache, "--cache-public-key", str(pub))
                steps = len(re.findall(r"building \.\.\.|generating \.\.\.", lines))
                figures["warm"] = {"seconds": round(seconds, 2), "engine_steps_run": steps,
                                   **cache_figures(lines)}
                figures["warm"]["stages"] = stages(lines)
        finally:
            remove_namespace(namespace)
    figures["ratio"] = round(figures["warm"]["seconds"] / figures["cold"]["seconds"], 3)
    return {"image": "node-minimal", "config": "default", "figures": figures, "goal_ratio": GOAL_RATIO}


def run() -> list[tuple[object, ...]]:
    out = ROOT / "build" / "bench" / "fleet-cache.json"
    previous = json.loads(out.read_text()) if out.is_file() else None
    data = measure()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    f = data["figures"]
    was = (previous or {}).get("figures", {})

    def vs(name: str) -> str:
        old = (was.get(name) or {}).get("seconds")
        return f"previous run {old:.1f}s" if old else "no previous run"

    met = "met" if f["ratio"] <= GOAL_RATIO else "MISSED"
    return [
        ("figure", "seconds", "", "detail"),
        ("cold, empty engine, no cache (= before)", f"{f['cold']['seconds']:.1f}", vs("cold"),
         "base bootstrapped, every step built"),
        ("same build pushing to the cache", f"{f['push']['seconds']:.1f}", vs("push"),
         f"{f['push'].get('pushed', 0)} entries, {f['push'].get('mb_pushed', 0):.0f} MB pushed, signed"),
        ("cold, second empty engine, cache warm", f"{f['warm']['seconds']:.1f}", vs("warm"),
         f"{f['warm'].get('pulled', 0)} entries, {f['warm'].get('mb_pulled', 0):.0f} MB pulled, "
         f"{f['warm']['engine_steps_run']} engine steps run"),
        ("warm / cold", f"{f['ratio']:.2f}", f"goal <= {GOAL_RATIO:.2f} {met}",
         "warm: " + ", ".join(f"{k} {v:.1f}s" for k, v in f["warm"].get("stages", {}).items())
         + " (the disks and netboot files are assembled on the second engine)"),
        ("written", "", "", str(out.relative_to(ROOT))),
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for row in run():
        print("  ".join(f"{c!s:<{w}}" for c, w in zip(row, WIDTHS, strict=False)))
