"""A small typed schema language: scalars, lists, maps and structs with defaults, bounds and a doc
string per field. Structural checks only; the semantic checks are named checks (builder.checks)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from ..errors import Collector
from .yamlsrc import line_of

_MISSING = object()


@dataclass
class Ctx:
    file: str
    out: Collector

    def error(self, container: Any, key: Any, path: str, message: str, remedy: str = "") -> None:
        self.out.add(self.file, line_of(container, key), path, message, remedy)


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"string {value!r}"
    return f"{type(value).__name__} {value!r}"


class Spec:
    doc = ""

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        raise NotImplementedError

    def expected(self) -> str:
        raise NotImplementedError


@dataclass
class Str(Spec):
    pattern: str | None = None
    what: str = "a string"

    def expected(self) -> str:
        return self.what

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return _MISSING
        value = str(value)
        if self.pattern and not re.fullmatch(self.pattern, value):
            ctx.error(parent, key, path, f"expected {self.what}, found {value!r}")
            return _MISSING
        return value


@dataclass
class Enum(Spec):
    choices: tuple[str, ...]

    def expected(self) -> str:
        return "one of " + ", ".join(self.choices)

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if value not in self.choices:
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        return value


@dataclass
class Int(Spec):
    min: int | None = None
    max: int | None = None

    def expected(self) -> str:
        if self.min is not None and self.max is not None:
            return f"an integer {self.min}..{self.max}"
        if self.min is not None:
            return f"an integer >= {self.min}"
        return "an integer"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {value}")
            return _MISSING
        return value


class Bool(Spec):
    def expected(self) -> str:
        return "true or false"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, bool):
            ctx.error(parent, key, path, f"expected true or false, found {describe(value)}")
            return _MISSING
        return value


class Scalar(Spec):
    """A string, number or boolean: sysctl values, label values, parameter values."""

    def expected(self) -> str:
        return "a string, number or boolean"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if value is None or isinstance(value, dict | list):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        return value


class AnyValue(Spec):
    def expected(self) -> str:
        return "any value"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        return value


@dataclass
class ListOf(Spec):
    item: Spec
    unique: bool = False

    def expected(self) -> str:
        return f"a list of {self.item.expected()}"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, list):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        out = []
        seen: set[Any] = set()
        for i, item in enumerate(value):
            checked = self.item.check(item, ctx, value, i, f"{path}[{i}]")
            if checked is _MISSING:
                continue
            if self.unique and isinstance(checked, str):
                if checked in seen:
                    ctx.error(value, i, f"{path}[{i}]", f"{checked!r} is listed twice", "remove the repeat")
                    continue
                seen.add(checked)
            out.append(checked)
        return out


@dataclass
class MapOf(Spec):
    key: Str
    value: Spec

    def expected(self) -> str:
        return f"a mapping of {self.key.expected()} to {self.value.expected()}"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, dict):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        out = {}
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if self.key.check(k, ctx, value, k, sub) is _MISSING:
                continue
            checked = self.value.check(v, ctx, value, k, sub)
            if checked is not _MISSING:
                out[str(k)] = checked
        return out


@dataclass
class Field:
    spec: Spec
    doc: str
    required: bool = False
    default: Any = None


@dataclass
class Struct(Spec):
    fields: dict[str, Field]
    what: str = "a mapping"
    one_of: tuple[str, ...] = ()  # exactly one of these keys must be present

    def expected(self) -> str:
        return self.what

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, dict):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return _MISSING
        out: dict[str, Any] = {}
        for k in value:
            if k not in self.fields:
                sub = f"{path}.{k}" if path else str(k)
                close = _close_matches(str(k), self.fields)
                ctx.error(value, k, sub, f"unknown key {k!r}",
                          f"did you mean {close}?" if close else "known keys: " + ", ".join(self.fields))
        for name, f in self.fields.items():
            sub = f"{path}.{name}" if path else name
            if name in value:
                checked = f.spec.check(value[name], ctx, value, name, sub)
                if checked is not _MISSING:
                    out[name] = checked
            elif f.required:
                ctx.error(value, None, sub, f"missing required key {name!r} ({f.doc})")
            elif name not in self.one_of:
                out[name] = _copy_default(f.default)
        if self.one_of:
            present = [k for k in self.one_of if k in value]
            if len(present) != 1:
                found = ", ".join(present) if present else "none"
                ctx.error(value, None, path or "(top)",
                          f"expected exactly one of {', '.join(self.one_of)}, found {found}")
        return out


def _copy_default(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _close_matches(word: str, choices: Any) -> str:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else ""


def validate(spec: Spec, doc: Any, file: str, out: Collector) -> dict[str, Any]:
    result = spec.check(doc, Ctx(file, out), doc, None, "")
    return result if isinstance(result, dict) else {}
