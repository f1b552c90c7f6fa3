"""What `build --offline --mirror DIR` checks before anything is used: every file of the mirror
against its index, then that every image to build has its base and every locked package of its
layers in the mirror and nothing unlocked (a package not in the lock cannot be resolved offline).
The mirror must have been made for the image (its index lists it, on the base this build computes),
and where the lock records a .deb's or a wheel's sha256, the mirror's file has that sha256: the
index travels with the mirror, the lock is reviewed with the definitions."""

from __future__ import annotations

import os
from pathlib import Path

from .. import lockfile
from ..compose.image import lock_config
from ..errors import UsageError
from ..plan import BuildPlan, LayerStep
from ..progress import Progress, Timer
from .index import Index, check


def _image_problems(plan: BuildPlan, index: Index, mirror: Path, remirror: str) -> list[str]:
    """The mirror was made for this image and holds its base: else the one problem that says so."""
    image = plan.image
    if plan.base.kind == "debian" and plan.base.key not in index.bases:
        return [f"{image}: the mirror has no base {plan.base.key[:12]}: {remirror}"]
    entry = index.images.get(image)
    if entry is None:
        made = ", ".join(sorted(index.images)) or "no image at all"
        return [f"{image}: the mirror {mirror} was not made for {image} (its index lists {made}): {remirror}"]
    if entry["base"] != plan.base.key:
        return [f"{image}: the mirror holds it on base {entry['base'][:12]}, this build's base is "
                f"{plan.base.key[:12]} (the definitions changed since the mirror was made): {remirror}"]
    return []


def _package_problems(index: Index, lock: lockfile.Lock | None, name: str, version: str, where: str) -> list[str]:
    """A mirrored .deb whose sha256 is not the one the lock recorded for it (the index and the file
    agree, checked before: the lock is what says which bytes are right)."""
    entry = index.packages.get(name, {}).get(version)
    if entry is None:
        return [f"package {name}={version} of {where} is not in the mirror"]
    archive = lock.archives.get(name, {}) if lock else {}
    if "file" not in entry or archive.get("version") != version or not archive.get("sha256"):
        return []
    got = index.files[entry["file"]]["sha256"]
    if got != archive["sha256"]:
        return [f"package {name}={version} of {where}: the mirror's {entry['file']} has sha256 {got}, the lock "
                f"says {archive['sha256']}: do not use this mirror"]
    return []


def _step_problems(image: str, step: LayerStep, lock: lockfile.Lock | None, index: Index, mirror: Path) -> list[str]:
    relock = f"run `nodeforge lock {image}` where the network is, then `nodeforge mirror {image} DIR`"
    remirror = f"run `nodeforge mirror {image} DIR` where the network is and carry DIR over"
    entry = lockfile.entry(lock, step.layer) or {"direct": {}, "deps": {}}
    problems = []
    for name in (p.partition("=")[0] for p in step.packages):
        if name not in entry["direct"]:
            problems.append(f"package {name} of layer {step.layer} is not in images/{image}.lock: {relock}")
    if step.wheels and not lockfile.wheels_locked(lock, step.layer, list(step.wheels)):
        problems.append(f"wheels of layer {step.layer} are not in images/{image}.lock: {relock}")
    where = f"layer {step.layer}"
    for name, version in sorted({**entry["direct"], **entry["deps"]}.items()):
        problems += [f"{p} {mirror}: {remirror}" if p.endswith("not in the mirror") else f"{p}; {remirror}"
                     for p in _package_problems(index, lock, name, version, where)]
    for name, w in sorted(lockfile.wheels(lock, step.layer).items()):
        have = index.wheels.get(name, {}).get(w["version"])
        if have is None:
            problems.append(f"wheel {name}=={w['version']} of layer {step.layer} is not in the mirror "
                            f"{mirror}: {remirror}")
        elif w.get("sha256") and have["sha256"] != w["sha256"]:
            problems.append(f"wheel {name}=={w['version']} of layer {step.layer}: the mirror's {have['file']} has "
                            f"sha256 {have['sha256']}, the lock says {w['sha256']}: do not use this mirror; {remirror}")
    return problems


def _plan_problems(root: Path, plan: BuildPlan, index: Index, mirror: Path) -> list[str]:
    lock = lockfile.read(root, plan.image, lock_config(plan))
    config = f" --config {plan.config}" if plan.config else ""
    remirror = f"run `nodeforge mirror {plan.image} DIR{config}` where the network is and carry DIR over"
    first = _image_problems(plan, index, mirror, remirror)
    if first:
        return first
    return [p for step in plan.steps for p in _step_problems(plan.image, step, lock, index, mirror)]


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
