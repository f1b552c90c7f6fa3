"""The reference of every definition key, generated from the settings table in schema.py."""

from __future__ import annotations

import json

from ..errors import UsageError
from ..escaping import for_terminal
from .load import Tree, known
from .spec import Field, ListOf, MapOf, Spec, Struct

PARAM_TYPES = """\
  types:
    int, float           numbers; min and max bound them
    str                  a string; pattern (a regular expression) must match the whole value
    bool                 true or false
    list                 a list of scalars; list[str], list[int], list[float], list[bool] (or type: list
                         with items: T) check every item, and min, max, choices, pattern apply to each item
  values come from the default, then a config (params.<layer>.<param>), then the image
  (layers: [{<layer>: {<param>: value}}]), then --set <layer>.<param>=value. For a list, a plain list
  in a config or image is appended and {replace: [a, b]} replaces; --set L.P=[a,b] replaces and
  --set L.P+=[c] (or +=c) appends; null resets (scalars to the default, lists to empty)."""


def _walk(spec: Spec, prefix: str, out: list[str]) -> None:
    if isinstance(spec, ListOf) and isinstance(spec.item, Struct):
        _walk(spec.item, prefix + "[]", out)
        return
    if isinstance(spec, MapOf) and isinstance(spec.value, Struct):
        _walk(spec.value, prefix + ".<name>", out)
        return
    if not isinstance(spec, Struct):
        return
    for name, f in spec.fields.items():
        key = f"{prefix}.{name}" if prefix else name
        out.append(_line(key, f))
        _walk(f.spec, key, out)


def _line(key: str, f: Field) -> str:
    req = " (required)" if f.required else ""
    default = "" if f.required or f.default in (None, [], {}) else f"; default {f.default!r}"
    return f"  {key:<34} {f.spec.expected()}{req}: {f.doc}{default}"


def document(name: str, spec: Struct) -> str:
    out = [f"{name}:"]
    _walk(spec, "", out)
    if name == "param":
        out.append(PARAM_TYPES)
    return "\n".join(out)


def layer(tree: Tree, name: str) -> str:
    """`nodeforge schema layer NAME`: one layer's parameters with their types, bounds, defaults
    and docs; an unknown name is a usage error with the closest known one."""
    found = tree.layers.get(name)
    if found is None:
        raise UsageError(f"no layer named {name!r}; {known('layers', name, tree.layers)}")
    out = [f"layer {found.name} ({found.file}): {found.data.get('summary') or ''}".rstrip()]
    if not found.params:
        out.append("  no parameters")
    width = max((len(p) for p in found.params), default=0)
    for p in found.params.values():
        default = json.dumps(p.default, ensure_ascii=False)
        extra = f"; pattern {p.pattern}" if p.pattern else ""
        extra += "".join(f"; on {r} {json.dumps(v, ensure_ascii=False)}" for r, v in p.by_release)
        out.append(f"  {p.name:<{width}}  {p.bounds()}, default {default}{extra}")
        out.append(f"  {'':<{width}}  {p.doc}")
    out.append(f"  set with: a config's params.{found.name}.<param>, an image's layers: [{{{found.name}: {{<param>: "
               f"value}}}}], or --set {found.name}.<param>=value (`nodeforge schema param` says how they combine)")
    return "\n".join(for_terminal(line) for line in out)
