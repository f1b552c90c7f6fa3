"""The reference of every definition key, generated from the settings table in schema.py."""

from __future__ import annotations

from .spec import Field, ListOf, Spec, Struct


def _walk(spec: Spec, prefix: str, out: list[str]) -> None:
    if isinstance(spec, ListOf) and isinstance(spec.item, Struct):
        _walk(spec.item, prefix + "[]", out)
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
    return "\n".join(out)
