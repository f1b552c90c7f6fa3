"""Three variants of gpu-node (configs default, dgx-h100, v100-slurm), each from an empty engine
cache of our tags (an engine namespace, a build directory and a base tarball cache of its own),
one after the other, all with the same fleet cache: the first pushes what it builds, the others
pull what they share with it. The goal: engine step builds in all three equal to the number of
distinct keys (no key built twice). NVIDIA's repositories cannot be reached here: the toolkit and
the fabric manager come from the stand-in offline sources (tests/support/offline.py).

An engine step build is one engine build (a layer step, the initramfs step, the labelled image):
each writes its log under the build directory's logs/; a key is a step's content key. Written
to build/bench/fleet-variants.json; the previous run's figures are printed beside."""

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
WIDTHS = (40, 12, 16, 56)
CONFIGS = ("default", "dgx-h100", "v100-slurm")
_KEYED = re.compile(r"^\[gpu-node\] (layer \d+/\d+ \S+|initramfs \(after the last layer\)|base debian \S+ \S+)\s+"
                    r"(cached|pulled|built|reused|imported)\b", re.M)


def _variant(tmp: Path, config: str, cache: str, key: Path, pub: Path, sets: list[str]) -> dict[str, Any]:
    namespace = f"benchvar{os.getpid()}{CONFIGS.index(config)}"
    build = tmp / config
    env = {**os.environ, "NODEFORGE_BUILD_DIR": str(build), "NODEFORGE_CACHE_NAMESPACE": namespace,
           "NODEFORGE_CACHE": str(tmp / f"{config}-host-cache")}
    cmd = [sys.executable, "-m", "builder", "build", "images/gpu-node.yaml", "-c", config, *sets, "--cache", cache,
           "--cache-public-key", str(pub), "--secret", f"cache-signing={key}"]
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        raise SystemExit(f"gpu-node -c {config} failed:\n{p.stderr[-3000:]}")
    from benchmarks.fleet_cache import cache_figures

    cached = cache_figures(p.stderr)
    keys = sorted({fp["key"] for state in (build / "state").glob("*.json")
                   for fp in json.loads(state.read_text()).values()})
    found = _KEYED.findall(p.stderr)
    statuses = [s for what, s in found if what.startswith("layer")]
    other = {what.split(" ")[0]: s for what, s in found if not what.startswith("layer")}
    return {"config": config, "namespace": namespace, "seconds": round(seconds, 1),
            "engine_builds": len(list((build / "logs").rglob("*.log"))),
            "steps_built": statuses.count("built"), "steps_pulled": statuses.count("pulled"), "layer_keys": keys,
            "base": other.get("base", "?"), "initramfs": other.get("initramfs", "?"),
            "pulled": 0, "mb_pulled": 0.0, "pushed": 0, "mb_pushed": 0.0, **cached}


def measure() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.engine import remove_namespace
    from support.offline import offline_sets, offline_sources
    from support.registry import signed_cache

    variants: list[dict[str, Any]] = []
    with signed_cache("nodeforge-bench-variants-") as (tmp, key, pub, cache):
        try:
            with offline_sources() as base:
                for config in CONFIGS:
                    variants.append(_variant(tmp, config, cache, key, pub, offline_sets(base)))
        finally:
            for v in variants:
                remove_namespace(v["namespace"])
    distinct = len({k for v in variants for k in v["layer_keys"]})
    layer_builds = sum(v["steps_built"] for v in variants)
    return {"image": "gpu-node", "configs": list(CONFIGS), "variants": variants,
            "distinct_layer_keys": distinct, "layer_step_builds": layer_builds,
            "engine_builds": sum(v["engine_builds"] for v in variants)}


def run() -> list[tuple[object, ...]]:
    out = ROOT / "build" / "bench" / "fleet-variants.json"
    previous = json.loads(out.read_text()) if out.is_file() else None
    data = measure()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    was = {v["config"]: v for v in (previous or {}).get("variants", [])}
    rows: list[tuple[object, ...]] = [("variant (empty engine cache each)", "seconds", "", "detail")]
    for v in data["variants"]:
        old = was.get(v["config"], {}).get("seconds")
        rows.append((f"gpu-node -c {v['config']}", f"{v['seconds']:.1f}",
                     f"previous {old:.1f}s" if old else "no previous run",
                     f"{v['steps_built']} steps built, {v['steps_pulled']} pulled, base {v['base']}, initramfs "
                     f"{v['initramfs']}; {v['engine_builds']} engine builds; "
                     f"{v['pushed']} pushed ({v['mb_pushed']:.0f} MB), {v['pulled']} pulled ({v['mb_pulled']:.0f} MB)"))
    met = "met" if data["layer_step_builds"] == data["distinct_layer_keys"] else "MISSED"
    rows.append(("layer steps built / distinct layer keys",
                 f"{data['layer_step_builds']}/{data['distinct_layer_keys']}",
                 f"goal equal: {met}", f"engine builds in all: {data['engine_builds']} (initramfs and labelled "
                 "images included; a config's own labels are its own key)"))
    rows.append(("written", "", "", str(out.relative_to(ROOT))))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for row in run():
        print("  ".join(f"{c!s:<{w}}" for c, w in zip(row, WIDTHS, strict=False)))
