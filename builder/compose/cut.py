"""A cut image: a final image made from a full one by a layer with the `cut` key (layers/distroless).
The layer's steps assemble a directory inside the full image; the engine step then starts from an
empty base and copies that directory alone (dockerfile.fragment), so no shell, package tool or
anything else that built the image is left. The rules that keep it honest, checked when composing:

- cut/only-layer: the cut layer is the image's only layer, so every other layer is applied, and
  tested with a shell, in the image it is cut from;
- cut/container: only a container image built from another image is cut;
- cut/no-children: no image builds on a cut image (a step there would have no shell to run);
- cut/no-shell: the tests of a cut image read the image (image scope) or run its entrypoint or a
  program in it: none needs a shell.

The image's whole environment (inherited too) is written again on the empty base: the cut step
carries it, and its key takes it."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..checks.registry import check
from ..definitions.load import Image
from ..errors import Collector
from ..plan import BuildPlan, LayerStep, Test, Value

ONLY_LAYER = check("cut/only-layer", "compose", "a layer with `cut` is the only layer of its image",
                   "apply the other layers in the image it is cut from (from: {image: ...}) and give the cut "
                   "image the cut layer alone")
CONTAINER = check("cut/container", "compose", "a cut image is a container image built from another image",
                  "set kind: container and from: {image: THE-FULL-IMAGE}")
NO_CHILDREN = check("cut/no-children", "compose", "no image builds on a cut image",
                    "build on the image it is cut from, and cut the child instead")
NO_SHELL = check("cut/no-shell", "compose", "the tests of a cut image need no shell in it",
                 "test with image scope (file, package, env, label) or kind entrypoint; a test that needs a "
                 "shell belongs to the image it is cut from")


def is_cut(plan: BuildPlan) -> bool:
    return bool(plan.steps) and plan.steps[-1].cut is not None


def check_parent(image: Image, parent: BuildPlan | None, out: Collector) -> None:
    if parent is not None and is_cut(parent):
        NO_CHILDREN.report(out, image.file, image.line("from"), "from.image",
                           f"image {parent.image} is cut (layer {parent.steps[-1].layer}): nothing runs in it")


def with_environment(image: Image, steps: list[tuple[LayerStep, dict[str, Any]]], env: dict[str, Value],
                     out: Collector) -> list[tuple[LayerStep, dict[str, Any]]]:
    """The steps, the cut one carrying the image's whole environment; the rules on layers and kind."""
    cut = [s for s, _ in steps if s.cut is not None]
    if not cut:
        return steps
    if len(steps) != 1:
        ONLY_LAYER.report(out, image.file, image.line("layers"), "layers",
                          f"layer {cut[0].layer} cuts the image, and the image has {len(steps)} layers "
                          f"({', '.join(s.layer for s, _ in steps)})")
    if image.data["kind"] != "container" or not image.data["from"].get("image"):
        CONTAINER.report(out, image.file, image.line("kind"), "kind",
                         f"layer {cut[0].layer} cuts the image: it must be a container built from another image")
    full = tuple(sorted((k, v.value) for k, v in env.items()))
    return [(dataclasses.replace(s, env=full) if s.cut is not None else s, extra) for s, extra in steps]


def check_tests(image: Image, tests: list[Test], out: Collector) -> None:
    for t in tests:
        if t.scope == "container" and t.kind != "entrypoint":
            NO_SHELL.report(out, t.file, t.line, "tests", f"test {t.name!r} ({t.kind}, container scope) runs "
                            "in a shell, and the cut image has none")
