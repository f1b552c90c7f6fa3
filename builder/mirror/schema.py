"""The shape of a mirror's index, nodeforge-mirror.json, in the spec language
(builder.definitions.spec), and the cross-checks a schema cannot say: every file a base, package
or wheel names is a file of the index (so `index.check` verified it), every `in_base` names a base
of the index, and a wheel's sha256 is its file's. The index travels between machines: it is
untrusted input, read only through builder.definitions.documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..definitions.grammar import NAME
from ..definitions.spec import MISSING, Ctx, Enum, Field, Int, MapOf, Str, Struct, describe
from ..errors import Problem

FORMAT = 1


@dataclass
class JsonStr(Str):
    """A JSON string of a grammar: a number is not taken for one (a YAML definition's Str is)."""

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if not isinstance(value, str):
            ctx.error(parent, key, path, f"expected {self.what}, found {describe(value)}")
            return MISSING
        return super().check(value, ctx, parent, key, path)


# a path relative to the mirror, spelled the one way the mirror writes it: segments of file-name
# characters, none empty, none `.` or `..`, no leading `/`
_SEGMENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9._+~%@=,:-]+"
REL = JsonStr(rf"{_SEGMENT}(?:/{_SEGMENT})*", "a path relative to the mirror (no leading '/', no '.' or '..' "
          "segments; letters, digits, . _ + ~ % @ = , : -)", max_len=1024)
SHA256 = JsonStr(r"[0-9a-f]{64}", "a sha256: 64 lower-case hex digits", max_len=64)
KEY = JsonStr(r"[0-9a-f]{64}", "a base content key: 64 lower-case hex digits", max_len=64)
DEB = JsonStr(r"[a-z0-9][a-z0-9+.-]*", "a Debian package name", max_len=128)
DEB_VERSION = JsonStr(r"[A-Za-z0-9][A-Za-z0-9.+~:_-]*", "a Debian package version", max_len=256)
WHEEL = JsonStr(r"[A-Za-z0-9][A-Za-z0-9._-]*", "a wheel's project name", max_len=256)
IMAGE_NAME = JsonStr(NAME.pattern, NAME.what, max_len=NAME.max_len)
WHEEL_VERSION = JsonStr(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", "a wheel version", max_len=256)

IMAGE = Struct({
    "lock_sha256": Field(SHA256, "the sha256 of images/<image>.lock the mirror was made from", required=True),
    "base": Field(KEY, "the content key of the image's base", required=True),
}, what="an image entry {lock_sha256, base}")
PACKAGE = Struct({
    "file": Field(REL, "the .deb in the mirror (a key of files)"),
    "sha256_from": Field(Enum(("lock", "download")), "where the .deb's sha256 came from"),
    "in_base": Field(KEY, "the base that already holds this version"),
}, what="a package entry {file, sha256_from} or {in_base}", one_of=("file", "in_base"))
WHEEL_ENTRY = Struct({
    "file": Field(REL, "the wheel in the mirror (a key of files)", required=True),
    "sha256": Field(SHA256, "the lock's sha256 of the wheel", required=True),
}, what="a wheel entry {file, sha256}")
FILE = Struct({
    "sha256": Field(SHA256, "the file's sha256", required=True),
    "size": Field(Int(min=0), "the file's size in bytes", required=True),
}, what="a file entry {sha256, size}")

INDEX_SPEC = Struct({
    "format": Field(Int(min=FORMAT, max=FORMAT), "the index format", required=True),
    "images": Field(MapOf(IMAGE_NAME, IMAGE), "image -> the lock and base it was mirrored with", default={}),
    "bases": Field(MapOf(KEY, REL), "base content key -> its tarball (a key of files)", default={}),
    "packages": Field(MapOf(DEB, MapOf(DEB_VERSION, PACKAGE)), "package -> version -> where it is", default={}),
    "wheels": Field(MapOf(WHEEL, MapOf(WHEEL_VERSION, WHEEL_ENTRY)), "wheel -> version -> file", default={}),
    "files": Field(MapOf(REL, FILE), "every file of the mirror with its sha256 and size", default={}),
}, what="a nodeforge mirror index")


def cross_problems(doc: dict[str, Any], file: str, remedy: str) -> list[Problem]:
    """What the schema cannot say: each path named is a checked file, each in_base a base."""
    files: dict[str, Any] = doc["files"]
    bad: list[tuple[str, str]] = []
    for key, rel in doc["bases"].items():
        if rel not in files:
            bad.append((f"bases.{key}", f"the base's file {rel!r} is not among the index's files"))
        elif not rel.endswith(".tar"):
            bad.append((f"bases.{key}", f"expected a .tar file, found {rel!r}"))
    for name, versions in doc["packages"].items():
        for version, entry in versions.items():
            where = f"packages.{name}.{version}"
            if "file" in entry and entry["file"] not in files:
                bad.append((where, f"the package's file {entry['file']!r} is not among the index's files"))
            if "in_base" in entry and entry["in_base"] not in doc["bases"]:
                bad.append((where, f"in_base {entry['in_base'][:12]} is not among the index's bases"))
    for name, versions in doc["wheels"].items():
        for version, entry in versions.items():
            where = f"wheels.{name}.{version}"
            if entry["file"] not in files:
                bad.append((where, f"the wheel's file {entry['file']!r} is not among the index's files"))
            elif files[entry["file"]]["sha256"] != entry["sha256"]:
                have = files[entry["file"]]["sha256"]
                bad.append((where, f"sha256 {entry['sha256']} differs from its file's {have}"))
    return [Problem(file, None, path, message, remedy) for path, message in bad]
