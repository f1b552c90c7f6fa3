"""The layer DAG: requires, provides, conflicts, applies-to; a stable topological order.

Like diskimage-builder's element-deps: a required layer that exists is pulled in; a required
name that only some layer provides must be satisfied by a layer the image lists."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks.registry import check
from ..definitions.load import Config, Image, Layer, Tree, known
from ..errors import Collector

LAYER_KNOWN = check("layer/known", "compose", "an image lists layers that exist under layers/", "fix the name")
LAYER_ONCE = check("layer/once", "compose", "a layer is in an image once (not twice, not again after its parent)",
                   "list it once")
APPLIES_TO = check("layer/applies-to", "compose",
                   "a layer goes into the kinds of image it applies to (node, container)",
                   "remove it from the image or extend its applies-to")
REQUIRES = check("layer/requires", "compose", "what a layer requires is a layer of the image or provided by one",
                 "add a layer that provides it")
CONFLICTS = check("layer/conflicts", "compose", "two layers that conflict are not in one image",
                  "remove one of the two layers from the image")
CYCLE = check("layer/cycle", "compose", "layer requirements form no cycle",
              "break the cycle by removing one requirement")


@dataclass(frozen=True)
class Resolved:
    order: tuple[str, ...]


Where = tuple[str, int | None, str]  # file, line, key path


def resolve(tree: Tree, image: Image, inherited: tuple[str, ...], out: Collector,
            extra: tuple[str, ...] = (), config: Config | None = None) -> Resolved:
    """`extra`: layers a config adds after the image's own (skipped when already present); a
    problem with one of them is reported at the config's line that adds it."""
    listed = [name for name, _, _ in image.layer_refs]
    where: dict[str, Where] = {name: (image.file, line, f"layers.{name}") for name, _, line in image.layer_refs}
    for name in extra:
        if name not in listed and name not in inherited:
            listed.append(name)
            where[name] = _config_where(config, image, name)
    for name in listed:
        if name not in tree.layers:
            out.add(*where[name], f"no layer named {name!r}", known("layers", name, tree.layers), LAYER_KNOWN.name)
        elif name in inherited:
            out.add(*where[name], f"layer {name!r} is already in the parent image", "remove it from this image",
                    LAYER_ONCE.name)
    if len(set(listed)) != len(listed):
        dup = next(n for n in listed if listed.count(n) > 1)
        out.add(*where[dup], f"layer {dup!r} is listed twice", "list it once", LAYER_ONCE.name)
    if out.problems:
        return Resolved(())

    chosen: list[str] = []
    pending = list(listed)
    while pending:
        name = pending.pop(0)
        if name in chosen or name in inherited:
            continue
        chosen.append(name)
        for req in tree.layers[name].data["requires"]:
            if req in tree.layers and req not in chosen and req not in inherited and req not in pending:
                pending.append(req)

    present = set(chosen) | set(inherited)
    provided: dict[str, str] = {}
    for name in (*inherited, *chosen):
        provided[name] = name
        for p in tree.layers[name].data["provides"]:
            provided.setdefault(p, name)
    kind = image.data["kind"]
    for name in chosen:
        layer = tree.layers[name]
        if kind not in layer.data["applies-to"]:
            file, line, key = where.get(name, (image.file, image.line("layers"), f"layers.{name}"))
            out.add(file, line, key,
                    f"layer {name!r} applies to {', '.join(layer.data['applies-to'])}, not a {kind} image"
                    + (f" ({image.name})" if file != image.file else ""),
                    f"remove it from {'this config' if file != image.file else 'this image'} or extend its "
                    "applies-to", APPLIES_TO.name)
        for req in layer.data["requires"]:
            if req not in provided:
                providers = sorted(n for n, la in tree.layers.items() if req in la.data["provides"])
                out.add(layer.file, layer.line("requires"), "requires",
                        f"{name!r} requires {req!r}, which nothing in image {image.name!r} provides",
                        ("add one of: " + ", ".join(providers)) if providers else "no layer provides it", REQUIRES.name)
        for c in layer.data["conflicts"]:
            if c in provided and provided[c] != name:
                out.add(layer.file, layer.line("conflicts"), "conflicts",
                        f"{name!r} conflicts with {c!r} (from layer {provided[c]!r}) in image {image.name!r}",
                        "remove one of the two layers from the image", CONFLICTS.name)
    if out.problems:
        return Resolved(())
    return Resolved(tuple(_toposort(tree, chosen, present, out)))


def _config_where(config: Config | None, image: Image, name: str) -> Where:
    kind = image.data["kind"]
    if config is None:
        return image.file, image.line("layers"), f"layers.{name}"
    names = config.data["layers"][kind]
    i = names.index(name) if name in names else None
    return config.file, config.line("layers", kind, i) if i is not None else config.line("layers"), \
        f"layers.{kind}[{i}]"


def _toposort(tree: Tree, chosen: list[str], present: set[str], out: Collector) -> list[str]:
    provider = {}
    for name in chosen:
        provider[name] = name
        for p in tree.layers[name].data["provides"]:
            provider.setdefault(p, name)
    deps = {n: [provider[r] for r in tree.layers[n].data["requires"] if r in provider and provider[r] != n]
            for n in chosen}
    order: list[str] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(n: str, stack: list[str]) -> bool:
        if state.get(n) == 2:
            return True
        if state.get(n) == 1:
            cycle = [*stack[stack.index(n):], n]
            layer: Layer = tree.layers[n]
            out.add(layer.file, layer.line("requires"), "requires",
                    "dependency cycle: " + " -> ".join(cycle), CYCLE.remedy, CYCLE.name)
            return False
        state[n] = 1
        for d in deps[n]:
            if not visit(d, [*stack, n]):
                return False
        state[n] = 2
        order.append(n)
        return True

    for n in chosen:
        if not visit(n, []):
            return []
    return order
