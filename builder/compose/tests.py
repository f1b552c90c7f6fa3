"""The tests of a layer or image as the plan carries them: kind, scope (default and allowed, from the
test-kind table), `when`, and the boot checks derived from contributions (each sysctl value, each
kernel argument), so that a layer does not restate what it sets."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

from ..checks.registry import check
from ..definitions.spec import ListOf, Scalar, Spec, Str, Struct, control_problem
from ..definitions.tables import ALLOWED_SCOPES, DEFAULT_SCOPE, TEST, TEST_KINDS
from ..errors import Collector
from ..plan import Test, Value
from .scope import Merged

FALSE_WORDS = ("", "false", "0", "no", "none")
SCOPE_CHECK = check("test/scope", "compose", "a test kind runs only at the scopes that can check it",
                    "use a scope the kind allows (nodeforge schema layer lists them)")
FIELD_CHECK = check("test/field", "compose",
                    "a test field must be one its scope can check; none is silently ignored",
                    "drop the field or move the test to a scope that checks it")
RENDERED_VALUE = check("rendered/grammar", "compose", "a value a template renders (a file path, a module name, a "
                       "module option, a test's name and fields, an env or label value, an assert message) fits the "
                       "grammar of where it is written: a Jinja string literal such as \"\\x1b\" renders a control "
                       "character the definition's own text could not hold", "change the parameter so that the "
                       "rendered value fits, e.g. an absolute path without '..', a module name of [a-z0-9_-], one "
                       "line of printable text")
RESTATES = check("test/restates-contribution", "compose",
                 "a layer's boot test only restates what the boot check derived from its own sysctl values or "
                 "kernel arguments already verifies (`sysctl: {key, value}`, `sysctl -n KEY`, a cmdline test, "
                 "grep of /proc/cmdline)", "delete the test: nodeforge derives that check from the contribution "
                 "(nodeforge plan lists it under tests)")
TEXT_REMEDY = "render one line of printable text: no newline, escape or other control character"


def text_problem(value: Any, multiline: bool = False) -> str:
    """'' or why a rendered string holds a character no definition string may hold."""
    why = control_problem(value, multiline) if isinstance(value, str) else ""
    return f"expected {'text' if multiline else 'one line of text'}, {why}" if why else ""


def one_line(out: Collector, file: str, line: int | None, key: str, value: str) -> bool:
    """Whether a rendered env or label value is one line of text (a Dockerfile ENV or LABEL word
    cannot hold a control character: refused where the value is written, not later when rendering
    the Dockerfile, where it was a traceback)."""
    why = text_problem(value)
    if why:
        RENDERED_VALUE.report(out, file, line, key, f"{why} in the rendered value {value!r}", TEXT_REMEDY)
    return not why


def rendered_problems(spec: Spec, value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(key path, what is wrong) for every rendered string in value that its spec's grammar refuses:
    the load checks a template's literal text only, so a value is checked again once rendered."""
    if isinstance(spec, Struct) and isinstance(value, dict):
        for name, f in spec.fields.items():
            if value.get(name) is not None:
                yield from rendered_problems(f.spec, value[name], f"{path}.{name}")
    elif isinstance(spec, ListOf) and isinstance(value, list):
        for i, item in enumerate(value):
            yield from rendered_problems(spec.item, item, f"{path}[{i}]")
    elif isinstance(spec, Str | Scalar) and isinstance(value, str):
        grammar = spec if isinstance(spec, Str) else spec.text or Str()
        why = grammar.problem(value) if grammar.template or isinstance(spec, Scalar) \
            else text_problem(value, grammar.multiline)
        if why:
            yield path, why


def is_false(value: Any) -> bool:
    return str(value).strip().lower() in FALSE_WORDS


def make_test(t: dict[str, Any], owner: str, file: str, line: int | None, path: str, out: Collector,
              unjudged: dict[tuple[str, str], frozenset[str]] | None = None) -> Test | None:
    """A rendered test definition as a plan Test; None when `when` is false or the test is wrong.
    unjudged: (kind, scope) -> fields that scope cannot check (a definition error when set)."""
    kind = next((k for k in TEST_KINDS if t.get(k) is not None), None)
    when = t.get("when")
    if kind is None or (when is not None and is_false(when)):
        return None
    scope = t.get("scope") or DEFAULT_SCOPE[kind]
    if scope not in ALLOWED_SCOPES[kind]:
        SCOPE_CHECK.report(out, file, line, f"{path}.scope", f"a {kind} check cannot run at scope {scope!r}",
                           f"use scope {' or '.join(sorted(ALLOWED_SCOPES[kind]))}")
        return None
    for where, why in rendered_problems(TEST, t, path):
        RENDERED_VALUE.report(out, file, line, where, why)
        return None
    spec = t[kind]
    for name in sorted((unjudged or {}).get((kind, scope), frozenset())):
        if spec.get(name) is not None:
            FIELD_CHECK.report(out, file, line, f"{path}.{kind}.{name}",
                               f"a {kind} check at scope {scope} cannot check {name!r}")
            return None
    return Test(t["name"], owner, scope, kind, spec, tuple(t.get("requires") or ()), file, line)


def _covered(tests: list[Test]) -> tuple[set[tuple[str, str]], set[str]]:
    sysctl = {(str(t.spec["key"]), _words(t.spec["value"])) for t in tests
              if t.scope == "boot" and t.kind == "sysctl" and t.spec.get("value") is not None}
    args = {a for t in tests if t.scope == "boot" and t.kind == "cmdline" for a in t.spec.get("contains") or []}
    return sysctl, args


def _words(value: Any) -> str:
    return " ".join(str(value).split())


SYSCTL_N = re.compile(r"(?:/usr)?(?:/s?bin/)?sysctl -n (?P<key>[\w.]+)")
GREP_CMDLINE = re.compile(r"grep -[qwF]+ (?P<arg>\S+) /proc/cmdline")


def _restated(t: Test, sysctl: dict[str, str], args: set[str]) -> str:
    """What a layer's boot test restates of its own contributions (sysctl: key -> value, its kernel
    arguments), or '' when it checks something a derived check does not."""
    if t.scope != "boot":
        return ""
    if t.kind == "sysctl" and sysctl.get(str(t.spec["key"])) == _words(t.spec["value"]):
        return f"{t.spec['key']} = {_words(t.spec['value'])}"
    if t.kind == "cmdline" and t.spec.get("contains") and set(t.spec["contains"]) <= args:
        return "the kernel arguments " + " ".join(t.spec["contains"])
    if t.kind != "command" or t.spec.get("exit", 0) != 0 or t.spec.get("user"):
        return ""
    run = " ".join(t.spec["run"].split())
    expected = (t.spec.get("stdout") or {}).get("equals")
    key = SYSCTL_N.fullmatch(run)
    if key and expected is not None and sysctl.get(key["key"]) == _words(expected):
        return f"{key['key']} = {_words(expected)}"
    grep = GREP_CMDLINE.fullmatch(run)
    arg = shlex.split(grep["arg"])[0] if grep else None
    return f"the kernel argument {arg}" if arg in args and not t.spec.get("stdout") else ""


def check_restated(merged: Merged, explicit: list[Test]) -> None:
    """Report every layer test that only restates a sysctl value or kernel argument the layer itself
    contributes: the boot check derived from the contribution verifies it already."""
    sysctl: dict[str, dict[str, str]] = {}
    args: dict[str, set[str]] = {}
    for key, v in merged.table("sysctl").items():
        sysctl.setdefault(merged.owners.get(("sysctl", key), ""), {})[key] = _words(v.value)
    for name, v in merged.table("kernel.args").items():
        args.setdefault(merged.owners.get(("kernel.args", name), ""), set()).add(v.value)
    for t in explicit:
        what = _restated(t, sysctl.get(t.layer, {}), args.get(t.layer, set()))
        if what:
            RESTATES.report(merged.out, t.file, t.line, f"tests[{t.name!r}]",
                            f"this test only restates {what}, which layer {t.layer} sets itself: the boot "
                            "check derived from it verifies that already")


def _where(v: Value) -> tuple[str, int | None]:
    """The file and line a Value's provenance names: 'layer x (layers/x/layer.yaml:12) ...'."""
    inner = v.source.partition("(")[2].partition(")")[0]
    file, _, line = inner.rpartition(":")
    return (file, int(line)) if line.isdigit() else (inner, None)


def derived_boot_tests(merged: Merged, explicit: list[Test]) -> list[Test]:
    """One boot check per sysctl value and one per layer for its kernel arguments, each unless a
    written test already checks it. Values inherited from a parent image are its parent's to check."""
    check_restated(merged, explicit)
    have_sysctl, have_args = _covered(explicit)
    tests: list[Test] = []
    for key, v in list(merged.table("sysctl").items()):
        layer = merged.owners.get(("sysctl", key))
        if layer and (key, v.value) not in have_sysctl:
            file, line = _where(v)
            tests.append(Test(f"booted kernel has {key} = {v.value}", layer, "boot", "sysctl",
                              {"key": key, "value": v.value}, (), file, line))
    by_layer: dict[str, list[Value]] = {}
    for name, v in merged.table("kernel.args").items():
        layer = merged.owners.get(("kernel.args", name))
        if layer and v.value not in have_args:
            by_layer.setdefault(layer, []).append(v)
    for layer, values in by_layer.items():
        file, line = _where(values[0])
        tests.append(Test(f"booted kernel command line has the arguments of layer {layer}", layer, "boot", "cmdline",
                          {"contains": [v.value for v in values]}, (), file, line))
    return tests
