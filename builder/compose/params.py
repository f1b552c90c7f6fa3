"""Parameter precedence, lowest first: layer default < config < image < --set on the command line.

Merge rules: a scalar from a higher level replaces the lower one; a list from a higher level is
appended to the lower one; null resets (to the layer default for scalars, to empty for lists)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from ..checks.registry import check
from ..definitions.load import Config, Image, Tree
from ..errors import Collector, NodeforgeError

PARAM_KNOWN = check("param/known", "compose", "a parameter value names a layer of the tree and one of its parameters",
                    "fix the layer or parameter name")
PARAM_VALUE = check("param/value", "compose", "a parameter value has the parameter's type, bounds, choices or pattern",
                    "give a value within the parameter's bounds (nodeforge schema layer)")


@dataclass(frozen=True)
class Setting:
    layer: str
    param: str
    value: Any
    source: str  # where the value came from, for --explain


def parse_sets(items: list[str]) -> list[tuple[str, str, Any]]:
    out = []
    for item in items:
        key, eq, text = item.partition("=")
        layer, dot, param = key.partition(".")
        if not eq or not dot or not layer or not param:
            raise NodeforgeError(f"--set {item!r}: expected LAYER.PARAM=VALUE, e.g. --set sysctl.swappiness=10")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text
        out.append((layer, param, value))
    return out


def resolve_params(tree: Tree, order: tuple[str, ...], image: Image, config: Config | None,
                   sets: list[tuple[str, str, Any]], out: Collector) -> dict[str, dict[str, Setting]]:
    result: dict[str, dict[str, Setting]] = {}
    for name in order:
        layer = tree.layers[name]
        result[name] = {p.name: Setting(name, p.name, p.default,
                                        f"default ({layer.file}:{layer.line('params', p.name) or '?'})")
                        for p in layer.params.values()}

    levels: list[tuple[str, str, Any, str, int | None, str]] = []  # layer, param, value, source, line, file
    if config:
        for lname, values in config.data["params"].items():
            if lname not in tree.layers:
                out.add(config.file, config.line("params", lname), f"params.{lname}",
                        f"no layer named {lname!r}", "layers: " + ", ".join(sorted(tree.layers)), PARAM_KNOWN.name)
                continue
            for pname, value in values.items():
                line = config.line("params", lname, pname)
                levels.append((lname, pname, value, f"config {config.name} ({config.file}:{line})", line,
                               config.file))
    for lname, values, line in image.layer_refs:
        for pname, value in values.items():
            levels.append((lname, pname, value, f"image {image.name} ({image.file}:{line})", line, image.file))
    for lname, pname, value in sets:
        levels.append((lname, pname, value, f"--set {lname}.{pname}", None, "command line"))

    for lname, pname, value, source, line, file in levels:
        found = tree.layers.get(lname)
        if found is None:
            out.add(file, line, f"{lname}.{pname}", f"no layer named {lname!r}",
                    "layers: " + ", ".join(sorted(tree.layers)), PARAM_KNOWN.name)
            continue
        param = found.params.get(pname)
        if param is None:
            known = ", ".join(f"{k} ({p.bounds()})" for k, p in found.params.items()) or "none"
            out.add(file, line, f"{lname}.{pname}", f"layer {lname!r} has no parameter {pname!r}",
                    f"parameters of {lname}: {known}", PARAM_KNOWN.name)
            continue
        if lname not in result:
            continue  # a config may carry values for layers this image does not use
        current = result[lname][pname]
        if value is None:
            reset = [] if param.type == "list" else param.default
            result[lname][pname] = Setting(lname, pname, reset, f"reset by {source}")
            continue
        coerced, why = param.coerce(value)
        if why:
            out.add(file, line, f"{lname}.{pname}", why, f"{param.doc} ({param.bounds()})", PARAM_VALUE.name)
            continue
        if param.type == "list":
            coerced = [*current.value, *coerced]
            source = f"{current.source} + {source}"
        result[lname][pname] = Setting(lname, pname, coerced, source)
    return result
