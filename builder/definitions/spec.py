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
MISSING = _MISSING  # what a spec's check returns for a refused value (for specs defined outside this module)

# no definition string may hold these: C0 and C1 controls, DEL, Unicode line and paragraph separators.
# Single-line strings refuse tab, newline and carriage return too; multi-line ones (a description,
# inline file content, a step's shell) keep newline and tab.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
CONTROL_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_STR = 64 * 1024  # one string value (file content included); files under files/ are bounded apart
INT_BOUND = 1 << 63  # no definition integer is outside the 64-bit signed range
TEMPLATE_MARK = re.compile(r"\{\{|\{%")
LITERAL_PARTS = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)  # removed: what is left is literal


def control_problem(value: str, multiline: bool = False) -> str:
    """'' or why value holds a character no definition may hold (named by its code point)."""
    m = (CONTROL if multiline else CONTROL_LINE).search(value)
    if not m:
        return ""
    where = "" if multiline else "a single-line value, "
    return f"{where}found control character U+{ord(m.group()):04X} at offset {m.start()}"


def is_template(value: str) -> bool:
    return bool(TEMPLATE_MARK.search(value))


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
    """A string with a grammar. Every string refuses control characters; `multiline` keeps newline
    and tab. `template`: the value may be a Jinja2 template, whose rendered text the composer checks
    with `problem()` (the raw template is checked for control characters only)."""

    pattern: str | None = None
    what: str = "a string"
    multiline: bool = False
    template: bool = False
    max_len: int = MAX_STR
    chars: str | None = None  # a character class: what a template's literal text may hold

    def expected(self) -> str:
        return self.what

    def problem(self, value: str) -> str:
        """'' when value (a rendered value too) fits the grammar, else what is wrong."""
        if len(value) > self.max_len:
            return f"expected {self.what} of at most {self.max_len} characters, found {len(value)}"
        bad = control_problem(value, self.multiline)
        if bad:
            return f"expected {self.what}, {bad}"
        if self.pattern and not re.fullmatch(self.pattern, value):
            return f"expected {self.what}, found {value!r}"
        return ""

    def normalise(self, value: str) -> str:
        return value

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return _MISSING
        value = str(value)
        if self.template and is_template(value):
            bad = control_problem(value, self.multiline) if len(value) <= MAX_STR else "too long"
            if not bad and self.chars:
                literal = LITERAL_PARTS.sub("", value)
                stray = re.sub(f"{self.chars}+", "", literal)
                if stray:
                    bad = f"found {stray[0]!r} outside the template's {{{{ }}}} in {value!r}"
            if bad:
                ctx.error(parent, key, path, f"expected {self.what}, {bad}")
                return _MISSING
            return value
        why = self.problem(value)
        if why:
            ctx.error(parent, key, path, why, self.remedy(value))
            return _MISSING
        return self.normalise(value)

    def remedy(self, value: str) -> str:
        return ""


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
        if not -INT_BOUND <= value < INT_BOUND:
            ctx.error(parent, key, path, f"expected {self.expected()}, found a number of {len(str(value))} digits")
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


@dataclass
class Scalar(Spec):
    """A string, number or boolean: sysctl values, label values, parameter values. A string value
    has the grammar `text` (a single line without control characters by default)."""

    text: Str | None = None

    def expected(self) -> str:
        return "a string, number or boolean" + (f" ({self.text.what})" if self.text else "")

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if value is None or isinstance(value, dict | list):
            ctx.error(parent, key, path, f"expected {self.expected()}, found {describe(value)}")
            return _MISSING
        if isinstance(value, int) and not isinstance(value, bool) and not -INT_BOUND <= value < INT_BOUND:
            ctx.error(parent, key, path, f"expected {self.expected()}, found a number of {len(str(value))} digits")
            return _MISSING
        if isinstance(value, str):
            return (self.text or Str(template=True)).check(value, ctx, parent, key, path)
        return value


class AnyValue(Spec):
    """Any YAML value; every string in it is a single line without control characters and every
    integer within 64 bits."""

    def expected(self) -> str:
        return "any value"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, str):
            return Str(template=True).check(value, ctx, parent, key, path)
        if isinstance(value, int) and not isinstance(value, bool) and not -INT_BOUND <= value < INT_BOUND:
            ctx.error(parent, key, path, f"expected a value, found a number of {len(str(value))} digits")
            return _MISSING
        if isinstance(value, list):
            for i, item in enumerate(value):
                if self.check(item, ctx, value, i, f"{path}[{i}]") is _MISSING:
                    return _MISSING
        if isinstance(value, dict):
            for k, v in value.items():
                sub = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and Str().check(k, ctx, value, k, sub) is _MISSING:
                    return _MISSING
                if self.check(v, ctx, value, k, sub) is _MISSING:
                    return _MISSING
        return value


@dataclass
class OrNull(Spec):
    """The spec's value, or null (documents of other writers: a manifest's optional fields)."""

    spec: Spec

    def expected(self) -> str:
        return f"{self.spec.expected()} or null"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        return None if value is None else self.spec.check(value, ctx, parent, key, path)


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
    open: bool = False  # unknown keys are dropped, not refused (documents of other tools: OCI, registries)

    def expected(self) -> str:
        return self.what

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, dict):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return _MISSING
        out: dict[str, Any] = {}
        for k in value:
            if k not in self.fields and not self.open:
                sub = f"{path}.{k}" if path else str(k)
                close = _close_matches(str(k), self.fields) if len(str(k)) < 100 else ""
                ctx.error(value, k, sub, f"unknown key {str(k)[:100]!r}",
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
