"""The variants of a fleet build: every (image, config) pair asked for, composed as a build composes
it, deduplicated by what it builds (the plan key and the tags: a config that leaves an image's key as
it is builds it under the plain tags, so the two are one variant), and the step keys that more than
one variant builds (a base, a package phase, a layer step of the image or of an image it builds on).
What `nodeforge matrix` prints for a CI system's matrix or a scheduler's job array."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import lockfile
from ..definitions.load import Tree
from ..plan import BuildPlan
from .image import Memo, compose
from .params import Overrides

MATRIX_FORMAT = 1


@dataclass(frozen=True)
class Step:
    key: str
    image: str
    step: str  # "bootstrap" (the Debian base), "packages" (the package phase) or the layer's name


@dataclass
class Variant:
    plan: BuildPlan
    steps: list[Step]  # every step its build runs, the images it builds on first
    same_as: list[str | None] = field(default_factory=list)  # configs that compose the same build

    @property
    def name(self) -> str:
        return self.plan.image + (f"@{self.plan.config}" if self.plan.config else "")

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"name": self.name, "image": p.image, "config": p.config, "sets": list(p.sets), "key": p.key,
                "tags": list(p.tags), "command": p.build_command, "steps": len(self.steps),
                "same_as": list(self.same_as), "pinned": pinned(p)}


def pinned(plan: BuildPlan) -> bool:
    """Every layer of the plan pinned by a lock (else the build resolves it first, and its key moves)."""
    return all(s.locked for s in plan.steps)


def chain(tree: Tree, plan: BuildPlan, config: str | None, sets: Overrides, memo: Memo,
          kept: dict[str, lockfile.Lock] | None = None) -> list[BuildPlan]:
    """The plan and the plans of the images it builds on, the first parent first."""
    plans = [plan]
    while plans[0].base.kind == "image":
        plans.insert(0, as_built(tree, plans[0].base.image or "", config, sets, memo, kept or {}))
    return plans


def steps_of(plans: list[BuildPlan]) -> list[Step]:
    out: list[Step] = []
    for p in plans:
        if p.base.kind == "debian":
            out.append(Step(p.base.key, p.image, "bootstrap"))
        if p.install:
            out.append(Step(p.install.key, p.image, "packages"))
        out += [Step(s.key, p.image, s.layer) for s in p.steps]
    return out


def as_built(tree: Tree, name: str, config: str | None, sets: Overrides, memo: Memo,
              kept: dict[str, lockfile.Lock]) -> BuildPlan:
    """The plan a build composes: with the lock files, or, where they pin too little, with the
    resolution an earlier build kept under build/resolved/ when it pins every layer (as the build
    itself does: pipeline.Builder)."""
    plan = compose(tree, name, config, sets, memo=memo)
    if pinned(plan) or not kept:
        return plan
    again = compose(tree, name, config, sets, memo=memo, locks=kept)
    return again if pinned(again) else plan


def variants(tree: Tree, images: list[str], configs: list[str | None] | None, sets: Overrides) -> list[Variant]:
    """Each image with each config (None: no config and every config of the tree), deduplicated."""
    memo: Memo = {}
    kept = lockfile.kept_resolutions(tree.root)
    chosen = [c.name if (c := tree.config(ref)) else None for ref in configs] if configs is not None \
        else [None, *sorted(tree.configs)]
    out: list[Variant] = []
    seen: dict[tuple[str, tuple[str, ...]], Variant] = {}
    for ref in images:
        name = tree.image(ref).name
        for config in chosen:
            plan = as_built(tree, name, config, sets, memo, kept)
            if (same := seen.get((plan.key, plan.tags))) is not None:
                if config not in same.same_as and config != same.plan.config:
                    same.same_as.append(config)
                continue
            v = Variant(plan, steps_of(chain(tree, plan, config, sets, memo, kept)))
            seen[(plan.key, plan.tags)] = v
            out.append(v)
    return out


def matrix(found: list[Variant]) -> dict[str, Any]:
    """The JSON document: the variants, the keys more than one of them builds (with the variants that
    build each), the number of distinct step keys and the step builds they would run unshared."""
    users: dict[str, list[str]] = {}
    first: dict[str, Step] = {}
    for v in found:
        for s in v.steps:
            first.setdefault(s.key, s)
            if v.name not in users.setdefault(s.key, []):
                users[s.key].append(v.name)
    shared = [{"key": k, "image": first[k].image, "step": first[k].step, "variants": names}
              for k, names in users.items() if len(names) > 1]
    return {"format": MATRIX_FORMAT, "variants": [v.to_json() for v in found], "shared": shared,
            "distinct_keys": len(users), "step_builds_unshared": sum(len(v.steps) for v in found)}
