"""Room for the suite before it starts: the engine tests build gpu-node several times over (its
disks, the reproducibility check's second build, the fleet cache's registry, a site build's tree),
and a disk that fills half-way fails dozens of tests with "No space left on device".

FREE_GB (NODEFORGE_TEST_FREE_GB) is what the suite needs free on the file systems of the engine's
data, the temporary directory and build/. Where less is free, the engine's step cache is trimmed
(`nodeforge gc --all-namespaces`, oldest first: entries an output tag builds on are kept); where that
is not enough, the session stops before the first test with what to do."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import docker

from builder import paths
from builder.engine import gc

FREE_GB = float(os.environ.get("NODEFORGE_TEST_FREE_GB", "40"))
AGES = ("7d", "1d", "6h", "1h", "0s")


def free_gb(places: list[Path]) -> float:
    """The least free space of those places on this machine (the engine's data dir where it is local)."""
    return min(shutil.disk_usage(p).free for p in places if p.exists()) / 1e9


def _existing(p: Path) -> Path:
    """p, or the nearest directory above it that exists (build/ is made by the first build)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def make_room(c: docker.DockerClient, root: Path) -> str | None:
    """None when FREE_GB is free (after trimming the cache if need be), else the message to stop with."""
    places = [Path(str(c.info().get("DockerRootDir") or "/")), Path(tempfile.gettempdir()),
              _existing(paths.build_dir(root))]
    if free_gb(places) >= FREE_GB:
        return None
    for age in AGES:
        plan = gc.plan(c, gc.parse_age(age), all_namespaces=True)
        if plan.remove:
            gc.apply(c, plan)
            print(f"\ntests: {len(plan.remove)} step-cache entries older than {age} removed to make room "
                  f"({free_gb(places):.0f} GB free, {FREE_GB:.0f} needed)")
        if free_gb(places) >= FREE_GB:
            return None
    return (f"the suite needs {FREE_GB:.0f} GB free for the engine, {tempfile.gettempdir()} and build/; "
            f"{free_gb(places):.0f} GB are, with the step cache trimmed: free space (docker image prune, old "
            "output tags: docker rmi; leftover pytest-of-* directories) or set NODEFORGE_TEST_FREE_GB")
