"""Every (image, config) pair of a tree and the lock file that owns each (the rule in
compose.image._owned): what `nodeforge lock --check --all` covers and what a test keeps fully locked."""

from __future__ import annotations

from dataclasses import dataclass

from .. import lockfile
from ..definitions.load import Tree
from ..plan import BuildPlan
from .image import Memo, compose, lock_config


@dataclass(frozen=True)
class Pair:
    image: str
    config: str | None  # the config built with (None: no config)
    owner: str | None  # the config that owns its tags and lock (None: the plain ones)
    plan: BuildPlan

    @property
    def lock_name(self) -> str:
        return lockfile.lock_name(self.image, self.owner)

    @property
    def command(self) -> str:
        return lockfile.lock_command(self.image, self.config)


def pairs(tree: Tree) -> list[Pair]:
    """Every image with no config and with each config of the tree, in name order."""
    memo: Memo = {}
    out = []
    for image in sorted(tree.images):
        for config in (None, *sorted(tree.configs)):
            plan = compose(tree, image, config, memo=memo)
            out.append(Pair(image, config, lock_config(plan), plan))
    return out


def owners(tree: Tree) -> dict[str, Pair]:
    """One pair per lock file (lock name -> the first pair that owns it): what `lock --all` resolves."""
    out: dict[str, Pair] = {}
    for p in pairs(tree):
        out.setdefault(p.lock_name, p)
    return out


def unlocked(tree: Tree) -> list[str]:
    """A line per pair whose lock file does not pin every layer's packages (empty: fully locked)."""
    lines = []
    for p in pairs(tree):
        loose = [s.layer for s in p.plan.steps if not s.locked]
        if loose:
            lines.append(f"{p.image} with {'config ' + p.config if p.config else 'no config'}: "
                         f"images/{p.lock_name}.lock does not pin {', '.join(loose)}; run `{p.command}`")
    return lines
