"""What `build --offline --mirror DIR` checks before anything is used: every file of the mirror
against its index, then that every image to build has its base and every locked package of its
layers in the mirror and nothing unlocked (a package not in the lock cannot be resolved offline)."""

from __future__ import annotations

import os
from pathlib import Path

from .. import lockfile
from ..errors import UsageError
from ..plan import BuildPlan
from ..progress import Progress, Timer
from .index import Index, check


def _plan_problems(root: Path, plan: BuildPlan, index: Index, mirror: Path) -> list[str]:
    image = plan.image
    lock = lockfile.read(root, image)
    relock = f"run `nodeforge lock {image}` where the network is, then `nodeforge mirror {image} DIR`"
    remirror = f"run `nodeforge mirror {image} DIR` where the network is and carry DIR over"
    if plan.base.kind == "debian" and plan.base.key not in index.bases:
        return [f"{image}: the mirror has no base {plan.base.key[:12]}: {remirror}"]
    problems = []
    for step in plan.steps:
        entry = lockfile.entry(lock, step.layer) or {"direct": {}, "deps": {}}
        for name in (p.partition("=")[0] for p in step.packages):
            if name not in entry["direct"]:
                problems.append(f"package {name} of layer {step.layer} is not in images/{image}.lock: {relock}")
        if step.wheels and not lockfile.wheels_locked(lock, step.layer, list(step.wheels)):
            problems.append(f"wheels of layer {step.layer} are not in images/{image}.lock: {relock}")
        for name, version in sorted({**entry["direct"], **entry["deps"]}.items()):
            if version not in index.packages.get(name, {}):
                problems.append(f"package {name}={version} of layer {step.layer} is not in the mirror {mirror}: "
                                f"{remirror}")
        for name, w in sorted(lockfile.wheels(lock, step.layer).items()):
            if w["version"] not in index.wheels.get(name, {}):
                problems.append(f"wheel {name}=={w['version']} of layer {step.layer} is not in the mirror "
                                f"{mirror}: {remirror}")
    return problems


def prepare(root: Path, plans: list[BuildPlan], mirror: Path, progress: Progress) -> Index:
    """The mirror's index, once every file is verified and every plan is covered; else exit 2."""
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        raise UsageError(f"offline build: the engine at DOCKER_HOST={host} cannot mount the mirror {mirror}; "
                         "build offline with the local engine (unset DOCKER_HOST)")
    with Timer() as t:
        index = check(mirror)
    size = sum(f["size"] for f in index.files.values())
    for plan in plans:
        progress.say(plan.image, f"mirror {mirror}: {len(index.files)} files ({size / 1e6:.0f} MB) match its index "
                     f"({t.seconds:.1f}s)")
    problems = [p for plan in plans for p in _plan_problems(root, plan, index, mirror)]
    if problems:
        more = f"\n(and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise UsageError("offline build: " + "\n".join(problems[:10]) + more)
    return index
