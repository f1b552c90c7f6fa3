"""The plan of the image that was built, for the commands that judge or ship a built image (test,
boot, push, export).

A build records on its image the plan key (`io.nodeforge.key`), the config (`io.nodeforge.config`)
and the --set arguments (`io.nodeforge.sets`, a JSON list) it was composed with. A command that
reads a built image composes its plan from its own flags and compares the keys:

- the same key: that plan;
- another key and no -c/--set given: the plan recomposed from the recorded config and --set
  values (said on standard error), when that gives the image's key;
- otherwise a UsageError (exit 2) naming both keys and the flags that match the built image, and
  the build command that would make the image these flags ask for. Never a silent mismatch.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from .. import lockfile
from ..compose.image import compose
from ..compose.params import Overrides, parse_sets
from ..definitions.load import Tree
from ..errors import NodeforgeError, UsageError
from ..plan import BuildPlan
from .labels import CONFIG_LABEL, KEY_LABEL, SETS_LABEL


@dataclass(frozen=True)
class Recorded:
    """What an image's labels say it was built from."""

    key: str
    config: str | None
    sets: tuple[str, ...]

    def flags(self) -> list[str]:
        out = ["-c", self.config] if self.config else []
        for s in self.sets:
            out += ["--set", s]
        return out


def recorded(labels: dict[str, str]) -> Recorded | None:
    """The recorded build flags, or None for an image without a nodeforge key."""
    key = labels.get(KEY_LABEL)
    if not key:
        return None
    try:
        sets = json.loads(labels.get(SETS_LABEL) or "[]")
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: recorded as no --set
        sets = []
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        sets = []
    return Recorded(key, labels.get(CONFIG_LABEL) or None, tuple(sets))


def image_labels(c: docker.DockerClient, ref: str) -> dict[str, str] | None:
    """The labels of the image under ref, or None when there is no such image."""
    try:
        attrs: dict[str, Any] = c.api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def _flag_text(flags: list[str]) -> str:
    return shlex.join(flags) if flags else "no -c/--set"


def built_plan(tree: Tree, image_ref: str, config: str | None, sets: Overrides, command: str,
               labels_of: Callable[[str], dict[str, str] | None]) -> tuple[BuildPlan, str | None,
                                                                          Overrides]:
    """(plan, config, sets) that describe the image built under the plan's first tag; `labels_of`
    reads an image's labels (None: no such image, and the plan from the flags is returned).
    `command` names the command in messages."""
    plan = compose(tree, image_ref, config, sets)
    labels = labels_of(plan.tags[0])
    rec = recorded(labels) if labels is not None else None
    if rec is None or rec.key == plan.key:
        return plan, config, sets
    kept = lockfile.kept_resolutions(tree.root)  # a build whose lock file pinned too little used these
    if kept:
        with_kept = compose(tree, image_ref, config, sets, locks=kept)
        if with_kept.key == rec.key:
            return with_kept, config, sets
    given = (["-c", config] if config else []) + [a for s in plan.sets for a in ("--set", s)]
    tag = plan.tags[0]
    if not given:
        rec_sets: Overrides = []
        try:
            rec_sets = parse_sets(list(rec.sets))
            again: BuildPlan | None = compose(tree, image_ref, rec.config, rec_sets)
        except NodeforgeError:  # a config or parameter the definitions no longer have
            again = None
        if again is not None and again.key == rec.key:
            print(f"{command}: {tag} was built with {_flag_text(rec.flags())}; using that plan "
                  f"({rec.key[:12]})", file=sys.stderr)
            return again, rec.config, rec_sets
        now = f"compose plan {again.key[:12]}" if again else "no longer compose"
        rebuild = " ".join(["nodeforge build", f"images/{plan.image}.yaml", *map(shlex.quote, rec.flags())])
        raise UsageError(
            f"{tag} was built from plan {rec.key[:12]} ({_flag_text(rec.flags())}), and the definitions now {now} "
            f"with those flags: the image is out of date; rebuild it ({rebuild}), or build the plan these "
            f"definitions give without flags (nodeforge build images/{plan.image}.yaml)")
    matching = " ".join(["nodeforge", command, plan.image, *map(shlex.quote, rec.flags())])
    raise UsageError(
        f"{tag} was built from plan {rec.key[:12]} ({_flag_text(rec.flags())}), but {_flag_text(given)} composes "
        f"plan {plan.key[:12]}: run `{matching}` (or give no -c/--set) for the image that was built, or build "
        f"this plan first: nodeforge build images/{plan.image}.yaml {shlex.join(given)}")
