"""Stage 1: read layers/, images/ and configs/ into validated, frozen definitions."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Collector, DefinitionError, Problem
from .confine import inside_files, link_problem, outside_root
from .spec import describe, validate
from .tables import CONFIG, IMAGE, LAYER
from .yamlsrc import LDict, line_of, load_file

PACKAGE_PHASE = "packages"  # the name the package phase's step goes by (its script, its build state): no layer's
BOOT_PHASE = "boot-config"  # the step after the last layer (and the initramfs) that writes what only a booted
# node reads: every layer's sysctl and kernel-argument files (compose.phases); no layer's name either
RESERVED = {PACKAGE_PHASE: "the package phase's", BOOT_PHASE: "the boot configuration step's"}

# the names a layer's templates see besides its own parameters (compose.image builds the context,
# compose.render adds the globals) and the names Jinja gives a meaning of its own: a parameter named
# like one of them would be shadowed (the firmware layer's `image` rendered as the image's dict) or
# would shadow it. A test checks this table against the context and the globals.
_JINJA = "a name Jinja gives a meaning of its own"
RESERVED_PARAMS: dict[str, str] = {
    "params": "every layer's parameters (params.LAYER.NAME)",
    "site": "the config's site facts (site.gpu, site.fabric, ...)",
    "image": "the image being composed (image.name, image.kind, image.version)",
    "range": "the template global range()", "namespace": "the template global namespace()",
    "dict": "the template global dict()",
    **{n: _JINJA for n in ("loop", "self", "caller", "varargs", "kwargs", "super")},
    **{n: "a Jinja literal" for n in ("true", "false", "none")},
    **{n: "a Jinja operator" for n in ("and", "or", "not", "in", "is", "if", "else")},
}


def known(what: str, name: str, names: Any) -> str:
    """The fix for an unknown name: the closest known one (a typo), then every known one."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return (f"did you mean {close[0]}? " if close else "") + f"{what}: " + ", ".join(sorted(names))


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Any
    doc: str
    min: int | None = None
    max: int | None = None
    choices: tuple[Any, ...] | None = None
    pattern: str | None = None
    items: str | None = None  # a list's item type (str, int, float, bool, path, ...); None: any scalar
    by_release: tuple[tuple[str, Any], ...] = ()  # (Debian release, its default), checked like the default

    def default_for(self, release: str) -> tuple[Any, str]:
        """(the default for an image on this release, the release whose value it is or "")."""
        for name, value in self.by_release:
            if name == release:
                return value, name
        return self.default, ""

    def coerce(self, value: Any) -> tuple[Any, str]:
        """Return (value, "") or (None, what was wrong)."""
        t = self.type
        if value is None:
            return None, "null"
        if t == "list":
            return self._coerce_list(value)
        if t == "bool":
            if not isinstance(value, bool):
                return None, f"expected true or false, found {describe(value)}"
        elif t == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return None, f"expected an integer, found {describe(value)}"
        elif t == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None, f"expected a number, found {describe(value)}"
            value = float(value)
        elif t == "str":
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                return None, f"expected a string, found {describe(value)}"
            value = str(value)
        elif t in self._typed():
            value, why = self._coerce_typed(value)
            if why:
                return None, why
        elif t == "list":
            if not isinstance(value, list):
                return None, f"expected a list, found {describe(value)}"
            value = list(value)
        if t in ("int", "float"):
            if self.min is not None and value < self.min:
                return None, f"expected a value >= {self.min}, found {value}"
            if self.max is not None and value > self.max:
                return None, f"expected a value <= {self.max}, found {value}"
        if self.choices is not None and value not in self.choices:
            return None, f"expected one of {', '.join(map(str, self.choices))}, found {value!r}"
        if self.pattern and (t == "str" or t in self._typed()) and not re.fullmatch(self.pattern, value):
            return None, f"expected a value matching {self.pattern!r}, found {value!r}"
        return value, ""

    def _coerce_list(self, value: Any) -> tuple[Any, str]:
        """A list of items of the item type; min, max, choices and pattern apply to each item."""
        if not isinstance(value, list):
            return None, f"expected a list of {self.items or 'scalar'} items such as [a, b], found {describe(value)}"
        item = Param(self.name, self.items or "str", self._ITEM, self.doc, self.min, self.max, self.choices,
                     self.pattern)
        out = []
        for i, v in enumerate(value):
            if self.items is None:
                if isinstance(v, dict | list) or v is None:
                    return None, (f"item {i}: expected a scalar (str, int, float or bool), found {describe(v)}; "
                                  "a list parameter holds scalars (declare the item type with items: or "
                                  "type: list[str])")
                out.append(v)
                continue
            coerced, why = item.coerce(v)
            if why:
                return None, f"item {i}: {why} (items: {self.items})"
            out.append(coerced)
        return out, ""

    _ITEM = "<item>"  # the default of a list's item parameter: never empty, so an empty item is refused

    @staticmethod
    def _typed() -> dict[str, Any]:
        """The string types with a grammar (path, host, address, url, url-or-file)."""
        from .grammar import PARAM_TYPES  # here: the module's imports belong to the loader's functions
        return PARAM_TYPES

    def _coerce_typed(self, value: Any) -> tuple[Any, str]:
        """A value of a string type with a grammar; '' only where the default is '' (not set). A path is
        normalised."""
        spec = self._typed()[self.type]
        if isinstance(value, bool) or not isinstance(value, str):
            return None, f"expected {spec.what}, found {describe(value)}"
        if value == "" and self.default in (None, ""):  # None: the default itself is being read
            return "", ""
        why = spec.problem(value)
        return (None, why) if why else (spec.normalise(value), "")

    def bounds(self) -> str:
        parts = [f"list[{self.items}]" if self.type == "list" and self.items else self.type]
        if self.min is not None or self.max is not None:
            parts.append(f"{'' if self.min is None else self.min}..{'' if self.max is None else self.max}")
        if self.choices:
            parts.append("one of " + "|".join(map(str, self.choices)))
        return " ".join(parts)


@dataclass(frozen=True)
class Definition:
    name: str
    file: str  # path relative to the tree root, as shown in messages
    data: dict[str, Any]  # validated, with defaults
    raw: Any  # the positioned YAML, for line numbers

    def line(self, *keys: Any) -> int | None:
        node = self.raw
        line = line_of(node)
        for k in keys:
            if isinstance(node, dict | list) and (k in node if isinstance(node, dict) else
                                                  isinstance(k, int) and k < len(node)):
                line = line_of(node, k) or line
                node = node[k]
            else:
                break
        return line


@dataclass(frozen=True)
class Layer(Definition):
    dir: Path = Path()
    params: dict[str, Param] = field(default_factory=dict)


@dataclass(frozen=True)
class Image(Definition):
    layer_refs: tuple[tuple[str, dict[str, Any], int | None], ...] = ()  # (layer, params, line)


@dataclass(frozen=True)
class Config(Definition):
    pass


@dataclass(frozen=True)
class Tree:
    root: Path
    layers: dict[str, Layer]
    images: dict[str, Image]
    configs: dict[str, Config]

    def image(self, ref: str) -> Image:
        name = _ref_name(ref, "images")
        if name not in self.images:
            raise DefinitionError([Problem(ref, None, "", "no such image", known("images", name, self.images))])
        return self.images[name]

    def config(self, ref: str | None) -> Config | None:
        if ref is None:
            return None
        name = _ref_name(ref, "configs")
        if name not in self.configs:
            raise DefinitionError([Problem(ref, None, "", "no such config", known("configs", name, self.configs))])
        return self.configs[name]


def _ref_name(ref: str, folder: str) -> str:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml"):
        return p.stem
    return ref


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _load_layer(root: Path, d: Path, out: Collector) -> Layer | None:
    path = d / "layer.yaml"
    rel = _rel(root, path)
    why = link_problem(root, d, "a layer directory") or link_problem(root, d / "files", "a directory files/")
    if why:
        out.add(_rel(root, d), None, "", why, "replace the link by a directory of the layer's own")
        return None
    if not path.is_file():
        out.add(rel, None, "", "layer directory has no layer.yaml", "add one or remove the directory")
        return None
    loaded = _load_definition(root, path, LAYER, out, (d.name, "directory name"))
    if loaded is None:
        return None
    _, raw, data = loaded
    where = Definition("", rel, {}, raw)
    if d.name in RESERVED:
        out.add(rel, where.line("name"), "name",
                f"the layer name {d.name!r} is {RESERVED[d.name]} (its step, its script "
                f"/usr/lib/nodeforge/layers/{d.name}.sh and its build state go by it)",
                "rename the layer and its directory")
        return None
    params = _params(d.name, rel, where, data, out)
    _check_sources(root, d, rel, where, data, out)
    return Layer(d.name, rel, data, raw, dir=d, params=params)


def _params(layer: str, rel: str, where: Definition, data: dict[str, Any], out: Collector) -> dict[str, Param]:
    params: dict[str, Param] = {}
    for pname, p in data.get("params", {}).items():
        if pname in RESERVED_PARAMS:
            out.add(rel, where.line("params", pname), f"params.{pname}",
                    f"the parameter name {pname!r} is reserved: the layer's templates see {pname} as "
                    f"{RESERVED_PARAMS[pname]}, so the parameter could never be read",
                    f"rename the parameter (e.g. {layer.replace('-', '_')}_{pname}) and its uses in the "
                    "layer's templates, images and configs")
            continue
        choices = tuple(p["choices"]) if p.get("choices") is not None else None
        ptype, items = p["type"], p.get("items")
        if ptype.startswith("list["):  # list[str] is type: list with items: str
            ptype, items = "list", ptype[5:-1]
        if items is not None and ptype != "list":
            out.add(rel, where.line("params", pname, "items"), f"params.{pname}.items",
                    f"items is the item type of a list; the type is {ptype}", "drop items, or make it type: list")
            continue
        param = Param(pname, ptype, None, p["doc"], p.get("min"), p.get("max"), choices, p.get("pattern"), items)
        value, why = param.coerce(p["default"])
        if why:
            out.add(rel, where.line("params", pname, "default"),
                    f"params.{pname}.default", why)
            continue
        by_release: list[tuple[str, Any]] = []
        for release, given in (p.get("by-release") or {}).items():
            checked, why = param.coerce(given)
            if why:
                out.add(rel, where.line("params", pname, "by-release", release), f"params.{pname}.by-release.{release}",
                        why, f"the value for an image on {release}: {param.bounds()}")
                continue
            by_release.append((release, checked))
        params[pname] = Param(pname, ptype, value, p["doc"], param.min, param.max, choices, param.pattern, items,
                              tuple(by_release))
    return params


def _check_sources(root: Path, d: Path, rel: str, where: Definition, data: dict[str, Any], out: Collector) -> None:
    """Every file a layer copies from files/ (sources, repository keys) is inside files/, and no uid 0 but root's."""
    for i, f in enumerate(data.get("files", [])):
        if f.get("source"):
            why = inside_files(root, d, f["source"], "a file")
            if why:
                out.add(rel, where.line("files", i, "source"), f"files[{f['path']}].source", why,
                        "add the file or fix the name; a symlink under files/ must stay inside files/")
    for i, repo in enumerate(data.get("packages", {}).get("repos", [])):
        why = inside_files(root, d, repo["key"], "a key file")
        if why:
            out.add(rel, where.line("packages", "repos", i, "key"), f"packages.repos[{repo['name']}].key", why,
                    "add the repository's signing key under files/")
    for i, u in enumerate(data.get("users", [])):
        if u.get("uid") == 0 and u["name"] != "root":
            out.add(rel, where.line("users", i, "uid"), f"users[{i}].uid",
                    f"uid 0 is root's alone, found it for {u['name']!r}", "drop the uid or give another one")


def _layer_refs(raw_layers: Any, rel: str, out: Collector) -> list[tuple[str, dict[str, Any], int | None]]:
    refs: list[tuple[str, dict[str, Any], int | None]] = []
    if not isinstance(raw_layers, list):
        return refs
    for i, item in enumerate(raw_layers):
        line = line_of(raw_layers, i)
        if isinstance(item, str):
            refs.append((item, {}, line))
        elif isinstance(item, dict) and len(item) == 1:
            (name, params), = item.items()
            if params is None:
                params = {}
            if not isinstance(params, dict):
                out.add(rel, line, f"layers[{i}].{name}",
                        f"expected a mapping of parameter values, found {describe(params)}")
                continue
            refs.append((str(name), dict(params), line))
        else:
            out.add(rel, line, f"layers[{i}]",
                    f"expected a layer name or {{name: {{param: value}}}}, found {describe(item)}")
    return refs


def _load_definition(root: Path, path: Path, spec: Any, out: Collector,
                     expected: tuple[str, str] | None = None) -> tuple[str, Any, dict[str, Any]] | None:
    """A definition file read and validated, its name checked against the file name (or expected:
    the name and what it is, a layer's directory); None when it has problems (they are in `out`)."""
    rel = _rel(root, path)
    why = outside_root(root, path)
    if why:
        out.add(rel, None, "", why, "replace the link by the file itself")
        return None
    try:
        raw = load_file(path, rel)
    except DefinitionError as e:
        out.problems.extend(e.problems)
        return None
    before = len(out.problems)
    data = validate(spec, raw, rel, out)
    if not data or len(out.problems) > before:
        return None
    name, what = expected or (path.stem, "file name")
    if data.get("name") and data["name"] != name:
        out.add(rel, line_of(raw, "name"), "name", f"expected the {what} {name!r}, found {data['name']!r}",
                "rename one of them")
    return rel, raw, data


def load_tree(root: Path) -> Tree:
    out = Collector()
    if not root.is_dir():
        raise DefinitionError([Problem(str(root), None, "", "no such directory: expected a project tree with "
                                       "layers/, images/ and configs/", "give --root the project's directory")])
    root = root.resolve()
    if not any((root / d).is_dir() for d in ("layers", "images", "configs")):
        raise DefinitionError([Problem(str(root), None, "", "not a project tree: no layers/, images/ or configs/",
                                       "give --root the project's directory")])
    layers: dict[str, Layer] = {}
    layer_dir = root / "layers"
    why = link_problem(root, layer_dir, "a directory layers/")
    if why:
        out.add("layers", None, "", why, "replace the link by the directory")
    elif layer_dir.is_dir():
        for d in sorted(p for p in layer_dir.iterdir() if p.is_dir()):
            layer = _load_layer(root, d, out)
            if layer:
                layers[layer.name] = layer
    images: dict[str, Image] = {}
    for path in sorted((root / "images").glob("*.yaml")):
        loaded = _load_definition(root, path, IMAGE, out)
        if loaded is None:
            continue
        rel, raw, data = loaded
        refs = _layer_refs(raw.get("layers") if isinstance(raw, dict) else None, rel, out)
        images[path.stem] = Image(path.stem, rel, data, raw, layer_refs=tuple(refs))
    configs: dict[str, Config] = {}
    for path in sorted((root / "configs").glob("*.yaml")):
        loaded = _load_definition(root, path, CONFIG, out)
        if loaded is None:
            continue
        rel, raw, data = loaded
        if data.get("site") is None:
            data["site"] = validate(CONFIG.fields["site"].spec, LDict(), rel, out)
        for kind, names in data["layers"].items():
            for i, lname in enumerate(names):
                if lname not in layers:
                    out.add(rel, line_of(raw["layers"][kind], i), f"layers.{kind}[{i}]",
                            f"no layer named {lname!r}", known("layers", lname, layers))
        configs[path.stem] = Config(path.stem, rel, data, raw)
    out.raise_if_any()
    return Tree(root, layers, images, configs)
