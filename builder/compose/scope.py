"""What a contribution handler works with: the image-wide merged tables (conflicts are reported
as values are added) and one layer's scope (its templates, context, files and report position)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from .. import lockfile
from ..checks import kargs
from ..checks.registry import CHECKS, check
from ..debian import PACKAGE_CONFIG_DIRS
from ..definitions.load import Layer
from ..errors import Collector
from ..plan import CONFIG_FILES, PACKAGE_FILES, ContextFile, Value
from .params import Setting
from .render import environment, render_file, render_string, render_tree
from .textdiff import short_diff

CONFLICT_KARG = check("conflict/kernel-arg", "compose",
                      "two layers give one kernel argument different values (comma lists are merged)",
                      "set it in one layer only, or make it a parameter and set it in the config")


def conflict_check(what: str) -> str:
    return f"conflict/{what}"


def karg_key(arg: str) -> str:
    """A kernel argument's key in the merged table: its name, or for a repeated argument (console=)
    the whole argument: every distinct value is an argument of its own, kept in order."""
    name = kargs.split(arg)[0]
    return arg if kargs.is_repeated(name) else name


def file_phase(path: str) -> str:
    """The file phase (plan.FILE_PHASES) of a layer file the layer does not place: the package tools'
    configuration goes before the package installs."""
    return PACKAGE_FILES if path.startswith(PACKAGE_CONFIG_DIRS) else CONFIG_FILES


@dataclass
class Merged:
    """Image-wide contributions with provenance: one table per contribution kind."""

    out: Collector
    tables: dict[str, dict[str, Value]] = field(default_factory=dict)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, key) -> first layer
    contents: dict[str, bytes] = field(default_factory=dict)  # path -> the bytes its writer gave (this image's)

    def table(self, kind: str) -> dict[str, Value]:
        return self.tables.setdefault(kind, {})

    def conflict(self, what: str, key: str, old: Value, new: Value, file: str, line: int | None) -> None:
        CHECKS[conflict_check(what)].report(
            self.out, file, line, f"{what}.{key}",
            f"conflict: {old.source} sets {key} = {old.value!r}, {new.source} sets {key} = {new.value!r}")

    def scalar(self, what: str, key: str, new: Value, file: str, line: int | None, owner: str = "") -> None:
        table = self.table(what)
        old = table.get(key)
        if old is not None and old.value != new.value:
            self.conflict(what, key, old, new, file, line)
            return
        if old is None:
            table[key] = new
            if owner:
                self.owners[(what, key)] = owner

    def karg(self, arg: str, source: str, file: str, line: int | None, owner: str = "") -> None:
        table = self.table("kernel.args")
        name, value = kargs.split(arg)
        key = karg_key(arg)
        old = table.get(key)
        if old is None:
            table[key] = Value(arg, source)
            if owner:
                self.owners[("kernel.args", key)] = owner
            return
        if old.value == arg:
            return
        if kargs.is_multi(name) and value is not None:
            _, old_value = kargs.split(old.value)
            parts = (old_value or "").split(",")
            parts += [p for p in value.split(",") if p not in parts]
            table[name] = Value(f"{name}={','.join(parts)}", f"{old.source} + {source}")
            return
        CONFLICT_KARG.report(self.out, file, line, f"kernel.args.{name}",
                             f"conflict: {old.source} sets {name} = {old.value!r}, {source} sets {name} = {arg!r}")


_ENVIRONMENTS: dict[Path, jinja2.Environment] = {}


def layer_environment(files_dir: Path) -> jinja2.Environment:
    """One template environment per layer directory for the whole process, its string templates
    compiled once: validate composes every image, and most images share most layers."""
    env = _ENVIRONMENTS.get(files_dir)
    if env is None:
        env = environment(files_dir)
        env.from_string = functools.lru_cache(maxsize=4096)(env.from_string)  # type: ignore[method-assign,assignment]
        env.compile_expression = functools.lru_cache(maxsize=4096)(  # type: ignore[method-assign]
            env.compile_expression)
        _ENVIRONMENTS[files_dir] = env
    return env


def _mode(m: str) -> str:
    return m if len(m) == 4 else "0" + m


@dataclass
class LayerScope:
    """One layer while its contributions are read: render at a key path, report there, add files."""

    layer: Layer
    ctx: dict[str, Any]
    settings: dict[str, Setting]
    merged: Merged
    locked: lockfile.Lock | None = None
    env: jinja2.Environment = field(init=False)
    files: list[ContextFile] = field(default_factory=list)
    carry: dict[str, Any] = field(default_factory=dict)  # what one handler leaves for a later one

    def __post_init__(self) -> None:
        self.env = layer_environment(self.layer.dir / "files")

    @property
    def out(self) -> Collector:
        return self.merged.out

    @property
    def data(self) -> dict[str, Any]:
        return self.layer.data

    @property
    def name(self) -> str:
        return self.layer.name

    def line(self, *keys: Any) -> int | None:
        return self.layer.line(*keys)

    def source(self, *keys: Any) -> str:
        return f"layer {self.layer.name} ({self.layer.file}:{self.layer.line(*keys) or '?'})"

    def render(self, value: Any, *keys: Any) -> Any:
        """Every string in value rendered; list items that render empty dropped."""
        return render_tree(self.env, value, self.ctx, self.out, self.layer.file, self.line(*keys),
                           ".".join(map(str, keys)))

    def text(self, raw: str, path: str, *keys: Any) -> str | None:
        """One string template, reported at the line of keys under the key path `path`."""
        return render_string(self.env, raw, self.ctx, self.out, self.layer.file, self.line(*keys), path)

    def file_template(self, name: str, path: str, *keys: Any) -> str | None:
        return render_file(self.env, name, self.ctx, self.out, self.layer.file, self.line(*keys), path)

    def via(self, raw: Any) -> str:
        """Which parameters a template used and where their values came from: provenance through templates."""
        if not isinstance(raw, str) or "{{" not in raw:
            return ""
        try:
            names = jinja2.meta.find_undeclared_variables(self.env.parse(raw))
        except jinja2.TemplateSyntaxError:
            return ""
        return "".join(f" via {self.name}.{n} <- {self.settings[n].source}" for n in sorted(names)
                       if n in self.settings)

    def add_file(self, path: str, content: str | bytes, origin: str, line: int | None, mode: str = "0644",
                 owner: str = "root", group: str = "root", static: Path | None = None,
                 phase: str | None = None) -> None:
        """A file of the layer's build context; one path written by two layers is a conflict."""
        data = content.encode() if isinstance(content, str) else content
        sha = hashlib.sha256(data).hexdigest()
        old = self.merged.table("files").get(path)
        if old is not None:  # one path has one writer (the same bytes today: one edit later a conflict)
            first = self.merged.owners.get(("files", path)) or old.source
            found = ("with the same content: one path has one writer" if old.value == sha
                     else short_diff(self.merged.contents.get(path), data))
            verb = "both write" if old.value == sha else "write different contents to"
            CHECKS[conflict_check("files")].report(
                self.out, self.layer.file, line, f"files.{path}", f"conflict: {old.source} and {origin} {verb} "
                f"{path}" + (f" ({found})" if old.value == sha else f": {found}"),
                f"write {path} in one layer only: drop it from {first} or from layer {self.name}, "
                "or move it into a layer both require")
            return
        self.merged.scalar("files", path, Value(sha, origin), self.layer.file, line, owner=f"layer {self.name}")
        self.merged.contents[path] = data
        self.files.append(ContextFile(path, _mode(mode), owner, group, sha, origin,
                                      content if isinstance(content, str) else None,
                                      str(static) if static else None, phase or file_phase(path)))
