"""One run of one command: the parsed arguments, the project root, and what the command needs, each
made once and only when asked for: the tree, the --set overrides, the engine client and the plan of
each built image (met before the runner runs when the command needs a built image)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .table import BUILT, Command

if TYPE_CHECKING:
    import docker

    from ..compose.params import Overrides
    from ..definitions.load import Tree
    from ..plan import BuildPlan



class Built(NamedTuple):
    """The plan an image was built from, and the config and overrides that compose it."""

    plan: BuildPlan
    config: str | None
    sets: Overrides


def root_for(image_ref: str | None, given: str | None) -> Path:
    """--root, else the tree an images/NAME.yaml path lies in, else the current directory."""
    if given:
        return Path(given)
    p = Path(image_ref or "")
    if p.suffix in (".yaml", ".yml") and p.parent.name == "images":
        return p.parent.parent
    return Path(".")


@dataclass
class Invocation:
    command: Command
    args: argparse.Namespace
    root: Path = field(init=False)
    _built: dict[str, Built] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        refs = self.images
        self.root = root_for(refs[0] if refs else None, self.args.root)
        self.args.root = str(self.root)

    @property
    def images(self) -> list[str]:
        """The image references the command was given, in order (IMAGE or IMAGE...)."""
        one = getattr(self.args, "image", None)
        return [one] if one else list(getattr(self.args, "images", None) or [])

    @property
    def image(self) -> str:
        return self.images[0]

    @property
    def config(self) -> str | None:
        return getattr(self.args, "config", None)

    @cached_property
    def tree(self) -> Tree:
        from ..definitions.load import load_tree

        return load_tree(self.root)

    @cached_property
    def sets(self) -> Overrides:
        from ..compose.params import parse_sets

        return parse_sets(getattr(self.args, "set", None) or [])

    @cached_property
    def client(self) -> docker.DockerClient:
        from ..engine import client

        return client.client()

    def image_name(self, ref: str | None = None) -> str:
        """The name of the image a reference (a name or an images/NAME.yaml path) names; exit 2 for none."""
        return self.tree.image(ref or self.image).name

    def built(self, ref: str | None = None) -> Built:
        """The plan of the image built under ref's tag: the flags' plan when it matches the image's
        recorded key, the recorded one when no -c/--set was given, else exit 2 naming both."""
        ref = ref or self.image
        if ref not in self._built:
            from ..engine.recorded import built_plan, image_labels

            self._built[ref] = Built(*built_plan(self.tree, ref, self.config, self.sets, self.command.name,
                                                 lambda tag: image_labels(self.client, tag)))
        return self._built[ref]

    def meet_needs(self) -> None:
        if BUILT in self.command.needs:
            for ref in self.images:
                self.built(ref)
