"""Reading a rollout manifest back (`nodeforge diff A.json B.json`): a manifest travels between
machines and teams, so it is untrusted. It is read through the one document reader
(definitions.documents: a regular file only, bounded, strict JSON) and checked against the schema
below, so that any shape gives a usage error naming the file and the key, never a traceback.

Structs are open (a later format may add keys; they are dropped). Strings are any text of bounded
length: what a manifest says is shown escaped by the writers (builder.escaping), not refused, so
that a review sees what a manifest holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..definitions import documents
from ..definitions.spec import MISSING, Bool, Ctx, Field, Int, ListOf, MapOf, OrNull, Spec, Str, Struct, describe
from ..errors import UsageError

READABLE = (1, 2, 3)  # the formats `nodeforge diff` reads
WHAT = "manifest"
REMEDY = "give the manifest.json a build wrote (build/images/<image>/manifest.json)"
MAX_DEPTH = 64  # a parameter value nested deeper is not one a build wrote


@dataclass
class Text(Str):
    """Any string of at most `max_len` characters (control characters included: shown escaped)."""

    what: str = "a string"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, str):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return MISSING
        if len(value) > self.max_len:
            ctx.error(parent, key, path, f"expected {self.what} of at most {self.max_len} characters, "
                      f"found {len(value)}")
            return MISSING
        return value


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (iteratively: a deep value cannot exhaust the stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d <= MAX_DEPTH and isinstance(v, dict | list):
            todo += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


class AnyJson(Spec):
    """Any JSON value nested at most MAX_DEPTH deep (a parameter value, the base, the builder)."""

    def expected(self) -> str:
        return f"a JSON value nested at most {MAX_DEPTH} deep"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if _depth(value) > MAX_DEPTH:
            ctx.error(parent, key, path, f"expected {self.expected()}, found one nested deeper")
            return MISSING
        return value


TEXT = Text()
KEY = Text(max_len=1024)


def _f(spec: Spec, doc: str, required: bool = False, default: Any = None) -> Field:
    return Field(spec, doc, required, default)


PARAMETER = Struct({"value": _f(AnyJson(), "the parameter's value", True),
                    "source": _f(TEXT, "where the value was set", default="")},
                   "a parameter {value, source}", open=True)
LAYER = Struct({"name": _f(KEY, "the layer's name", True), "key": _f(OrNull(TEXT), "the step's content key"),
                "image": _f(OrNull(TEXT), "the image that built the layer"),
                "summary": _f(OrNull(TEXT), "the layer's summary"),
                "inherited": _f(Bool(), "built by an image this one builds on", default=False),
                "parameters": _f(MapOf(KEY, PARAMETER), "the layer's parameters", default={})},
               "a layer {name, key, image, parameters}", open=True)
PACKAGE = Struct({"name": _f(KEY, "the package's name", True), "version": _f(TEXT, "the installed version", True),
                  "architecture": _f(OrNull(TEXT), "the package's architecture"),
                  "layer": _f(OrNull(TEXT), "the layer that installed it"),
                  "sha256": _f(OrNull(TEXT), "the .deb's sha256")}, "a package {name, version}", open=True)
WHEEL = Struct({"name": _f(KEY, "the wheel's name", True), "version": _f(OrNull(TEXT), "its version"),
                "sha256": _f(OrNull(TEXT), "its sha256")}, "a wheel {name, version, sha256}", open=True)
FILE = Struct({"path": _f(KEY, "the file's path in the image", True),
               "layer": _f(TEXT, "the layer that wrote it", True), "image": _f(OrNull(TEXT), "the image that built it"),
               "sha256": _f(TEXT, "its sha256", True), "mode": _f(TEXT, "its mode", default=""),
               "inherited": _f(Bool(), "written by an image this one builds on", default=False),
               "lines": _f(OrNull(ListOf(Text(max_len=1 << 16))), "a small /etc text file's lines")},
              "a file {path, layer, sha256, mode}", open=True)
KEYS = Struct({name: _f(OrNull(TEXT), doc) for name, doc in (
    ("plan", "the key `nodeforge plan` prints"), ("content", "a node's content key (node.json content_key)"),
    ("assembly", "a node's assembly key (node.json key)"))}, "the build's keys {plan, content, assembly}", open=True)
OUTPUT = Struct({"sha256": _f(TEXT, "the file's sha256", True), "role": _f(TEXT, "what the file is", default="")},
                "an output {role, sha256}", open=True)
LOCK = Struct({"path": _f(TEXT, "the lock file", True), "sha256": _f(TEXT, "its sha256", True),
               "image": _f(OrNull(TEXT), "its image")}, "a lock {image, path, sha256}", open=True)
SOURCE = Struct({"revision": _f(TEXT, "the git commit", True),
                 "dirty": _f(Bool(), "tracked files differ", default=False),
                 "repository": _f(OrNull(TEXT), "where the tree came from")}, "a source {revision, dirty}", open=True)

MANIFEST = Struct({
    "format": _f(Int(), "the manifest format", True),
    "image": _f(TEXT, "the image's name", True),
    "kind": _f(OrNull(TEXT), "node or container"),
    "version": _f(TEXT, "the image's version", True),
    "config": _f(OrNull(TEXT), "the config it was built with"),
    "sets": _f(ListOf(TEXT), "the --set values", default=[]),
    "plan_key": _f(TEXT, "the plan's key", True),
    "image_digest": _f(OrNull(TEXT), "the image's OCI digest"),
    "engine_image_id": _f(OrNull(TEXT), "the engine's image id (format 1)"),
    "registry_digest": _f(OrNull(TEXT), "the digest in the registry"),
    "base": _f(AnyJson(), "what the image builds on"),
    "keys": _f(OrNull(KEYS), "the build's keys, each named (format 3)"),
    "layers": _f(ListOf(LAYER), "the layers", True),
    "files": _f(ListOf(FILE), "the files the layers write (format 3)", default=[]),
    "packages": _f(ListOf(PACKAGE), "every installed package", default=[]),
    "wheels": _f(ListOf(WHEEL), "every wheel", default=[]),
    "kernel_cmdline": _f(OrNull(TEXT), "the kernel command line"),
    "outputs": _f(MapOf(KEY, OUTPUT), "the files beside the manifest", default={}),
    "lock": _f(OrNull(LOCK), "the image's lock file"),
    "inherited_locks": _f(AnyJson(), "the locks of the images it builds on", default=[]),
    "source": _f(OrNull(SOURCE), "the project tree's revision"),
    "builder": _f(AnyJson(), "the nodeforge that built it"),
}, "a nodeforge manifest", open=True)


def read(path: Path) -> dict[str, Any]:
    """A manifest checked against the schema, or a UsageError naming the file and the key."""
    doc = documents.parse_json(documents.read_bytes(path, WHAT, REMEDY), path, WHAT, REMEDY)
    if not isinstance(doc, dict) or isinstance(doc.get("format"), bool) or doc.get("format") not in READABLE:
        found = describe(doc.get("format")) if isinstance(doc, dict) and "format" in doc else "no format"
        raise UsageError(f"{WHAT} {path}: not a nodeforge manifest (format {', '.join(map(str, READABLE))}; "
                         f"found {found}); {REMEDY}")
    return documents.check(doc, MANIFEST, path, WHAT, REMEDY)

