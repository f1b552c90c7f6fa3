"""Parameter precedence, lowest first: layer default < config < image < --set on the command line.

Merge rules: a scalar from a higher level replaces the lower one. A list parameter: in a config or
an image a plain list is appended to the lower level's list and `{replace: [..]}` replaces it; on
the command line `--set L.P=[a, b]` replaces and `--set L.P+=[c]` (or `+=c`) appends. null resets
(to the layer default for scalars, to empty for lists)."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..checks.registry import check
from ..definitions.load import Config, Image, Layer, Param, Tree, known
from ..definitions.yamlsrc import load_text
from ..errors import Collector, DefinitionError, NodeforgeError, UsageError

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


@dataclass(frozen=True)
class Append:
    """`--set L.P+=V`: items appended to a list parameter's lower-level value (a scalar V is one item)."""

    items: tuple[Any, ...]


class Override(NamedTuple):
    """One `--set LAYER.PARAM=VALUE` of the command line (the value read as YAML; `+=` gives an Append)."""

    layer: str
    param: str
    value: Any


Overrides = list[Override]

REPLACE = "replace"  # a config's or image's `{replace: [..]}` replaces a list instead of appending


def parse_sets(items: list[str]) -> Overrides:
    out = []
    for item in items:
        key, eq, text = item.partition("=")
        append = key.endswith("+")
        key = key.removesuffix("+")
        layer, dot, param = key.partition(".")
        if not eq or not dot or not layer or not param:
            raise NodeforgeError(f"--set {item!r}: expected LAYER.PARAM=VALUE (or LAYER.PARAM+=ITEMS for a list), "
                                 "e.g. --set sysctl.swappiness=10, --set kernel-args.extra=[quiet,nosmt]")
        _no_control(key, text)
        try:
            value = _plain(load_text(text, f"--set {key}")) if text != "" else ""
        except DefinitionError:
            value = text
        for decoded in _strings(value):  # a quoted YAML value decodes "\n" or "\x1b" after the first check
            _no_control(key, decoded)
        if append:
            if value is None or value == "":
                raise NodeforgeError(f"--set {item!r}: += appends items to a list, e.g. --set {key}+=[a,b]; "
                                     f"--set {key}=null empties it")
            value = Append(tuple(value) if isinstance(value, list) else (value,))
        out.append(Override(layer, param, value))
    return out


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _no_control(key: str, text: str) -> None:
    bad = _CONTROL.search(text)
    if bad:
        raise UsageError(f"--set {key}: a value cannot hold control character U+{ord(bad.group()):04X} "
                         "(a newline or escape would reach the files and scripts it is written into, and the "
                         "terminal that shows it)")


def _strings(value: Any) -> list[str]:
    """Every string in a parameter value (keys of a mapping too), however deeply nested."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def control_problem(value: Any) -> str:
    """'' or what control character a parameter value (a string, or a string in a list) holds."""
    for text in _strings(value):
        bad = _CONTROL.search(text)
        if bad:
            return (f"expected a value without control characters, found U+{ord(bad.group()):04X} in {text!r} "
                    "(a newline or escape would reach the files and scripts it is written into)")
    return ""


def _plain(value: Any) -> Any:
    """A --set value read with the bounded YAML reader (no alias bombs, no giant numbers), as plain data."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def format_sets(sets: Overrides) -> tuple[str, ...]:
    """The --set arguments that parse back into `sets` (what a build records on its image)."""
    out = []
    for layer, param, value in sets:
        if isinstance(value, Append):
            out.append(f"{layer}.{param}+={json.dumps(list(value.items), default=str)}")
        else:
            out.append(f"{layer}.{param}={json.dumps(value, default=str)}")
    return tuple(out)


def _list_syntax(lname: str, pname: str, on_command_line: bool) -> str:
    if on_command_line:
        return (f"--set {lname}.{pname}=[a,b] replaces the list, --set {lname}.{pname}+=[c] (or +=c) appends, "
                f"--set {lname}.{pname}=null empties it")
    return ("a YAML list [a, b] is appended to the lower level's list; {replace: [a, b]} replaces it; null "
            "empties it")


def _default(layer: Layer, p: Param, release: str) -> Setting:
    value, applied = p.default_for(release)
    if applied:
        line = layer.line("params", p.name, "by-release", applied) or "?"
        return Setting(layer.name, p.name, value, f"default for {applied} ({layer.file}:{line})")
    return Setting(layer.name, p.name, value, f"default ({layer.file}:{layer.line('params', p.name) or '?'})")


def resolve_params(tree: Tree, order: tuple[str, ...], image: Image, config: Config | None,
                   sets: Overrides, out: Collector, release: str = "") -> dict[str, dict[str, Setting]]:
    """release: the image's Debian release, which picks a parameter's by-release default."""
    result: dict[str, dict[str, Setting]] = {}
    for name in order:
        layer = tree.layers[name]
        result[name] = {p.name: _default(layer, p, release) for p in layer.params.values()}

    for lname, pname, value, source, line, file in _levels(tree, image, config, sets, out):
        found = tree.layers.get(lname)
        if found is None:
            out.add(file, line, f"{lname}.{pname}", f"no layer named {lname!r}", known("layers", lname, tree.layers),
                    PARAM_KNOWN.name)
            continue
        param = found.params.get(pname)
        if param is None:
            close = difflib.get_close_matches(pname, list(found.params), n=1)
            listed = ", ".join(f"{k} ({p.bounds()})" for k, p in found.params.items()) or "none"
            out.add(file, line, f"{lname}.{pname}", f"layer {lname!r} has no parameter {pname!r}",
                    (f"did you mean {close[0]}? " if close else "") + f"parameters of {lname}: {listed}",
                    PARAM_KNOWN.name)
            continue
        why = control_problem(value)
        if why:
            out.add(file, line, f"{lname}.{pname}", why, f"{param.doc} ({param.bounds()})", PARAM_VALUE.name)
            continue
        if lname in result:  # a config may carry values for layers this image does not use
            _apply(result[lname], param, lname, value, source, line, file, out, release)
    return result


Level = tuple[str, str, Any, str, int | None, str]  # layer, param, value, source, line, file


def _levels(tree: Tree, image: Image, config: Config | None, sets: Overrides,
            out: Collector) -> list[Level]:
    """Every value set above the layer defaults, lowest precedence first: config, image, --set."""
    levels: list[Level] = []
    if config:
        for lname, values in config.data["params"].items():
            if lname not in tree.layers:
                out.add(config.file, config.line("params", lname), f"params.{lname}",
                        f"no layer named {lname!r}", known("layers", lname, tree.layers), PARAM_KNOWN.name)
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
    return levels


def _apply(settings: dict[str, Setting], param: Param, lname: str, value: Any, source: str, line: int | None,
           file: str, out: Collector, release: str = "") -> None:
    """One value over the lower levels' setting of its parameter (merge rules in the module doc)."""
    pname = param.name
    current = settings[pname]
    if value is None:
        reset = [] if param.type == "list" else param.default_for(release)[0]
        settings[pname] = Setting(lname, pname, reset, f"reset by {source}")
        return
    on_command_line = file == "command line"
    is_list = param.type == "list"
    append = is_list and not on_command_line  # YAML lists append; --set L.P=[..] replaces
    if isinstance(value, Append):
        if not is_list:
            out.add(file, line, f"{lname}.{pname}", f"+= appends to a list; {lname}.{pname} is {param.bounds()}",
                    f"--set {lname}.{pname}=VALUE", PARAM_VALUE.name)
            return
        value, append = list(value.items), True
    elif is_list and isinstance(value, dict) and list(value) == [REPLACE]:
        value, append = value[REPLACE], False
    coerced, why = param.coerce(value)
    if why:
        remedy = f"{param.doc} ({param.bounds()})"
        if is_list:
            remedy += "; " + _list_syntax(lname, pname, on_command_line)
        out.add(file, line, f"{lname}.{pname}", why, remedy, PARAM_VALUE.name)
        return
    if append:
        coerced = [*current.value, *coerced]
        source = f"{current.source} + {source}"
    settings[pname] = Setting(lname, pname, coerced, source)


def check_sets_used(sets: Overrides, image: str, used: tuple[str, ...],
                    for_children: set[str]) -> None:
    """A --set for a layer the image (with its parents) does not use would be silently ignored, and
    recorded on the image as if it had counted: an error naming the layers it does use. for_children:
    the layers of the images built on this one (their builds compose it with their --set values)."""
    out = Collector()
    for lname, pname, _ in sets:
        if lname in used or lname in for_children:
            continue
        close = difflib.get_close_matches(lname, used, n=1)
        hint = f"did you mean --set {close[0]}.{pname}? " if close else ""
        out.add("command line", None, f"--set {lname}.{pname}", f"image {image} does not use layer {lname!r}",
                f"{hint}layers of {image} (with its parents): {', '.join(used) or 'none'}", PARAM_KNOWN.name)
    out.raise_if_any()


def where_set(expression: str, layer: str, settings: dict[str, dict[str, Setting]]) -> str:
    """The parameters an expression (an assert's `that`) names, each with its value and where it
    was set: `swappiness = 900 (--set sysctl.swappiness=900)`. Its own layer's by bare name, any
    layer's as params.LAYER.PARAM; empty when it names none."""
    named: list[Setting] = []
    for word in dict.fromkeys(re.findall(r"\b(?:params\.([\w-]+)\.)?([A-Za-z_]\w*)\b", expression)):
        lname, pname = word[0] or layer, word[1]
        s = settings.get(lname, {}).get(pname)
        if s is not None and s not in named:
            named.append(s)
    return "; ".join(f"{s.param if s.layer == layer else f'{s.layer}.{s.param}'} = {json.dumps(s.value)} "
                     f"({s.source})" for s in named)
