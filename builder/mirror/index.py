"""A mirror's index, nodeforge-mirror.json: every file of the mirror with its sha256 and size, the
packages (name, version -> the .deb, or the base that already holds it), the wheels, the bases and
the lock of each image it was made from. `check` verifies every file before a build uses any.

The index is untrusted (it travels between machines): it is read through
builder.definitions.documents against the schema of builder.mirror.schema, and every file it lists
must be a regular file inside the mirror, reached without a symbolic link, opened without blocking
(a FIFO or a device is refused, never opened for reading)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..definitions import documents
from ..errors import UsageError
from ..plan import sha256_file
from .schema import FORMAT, INDEX_SPEC, cross_problems

INDEX = "nodeforge-mirror.json"
WHAT = "nodeforge mirror index"
REMEDY = "make the mirror again with `nodeforge mirror IMAGE... DIR` where the network is, and carry it over whole"


@dataclass
class Index:
    # image -> {"lock_sha256", "base"}
    images: dict[str, dict[str, str]] = field(default_factory=dict)
    # base key -> file (relative)
    bases: dict[str, str] = field(default_factory=dict)
    # package -> version -> {"file", "sha256_from": lock|download} or {"in_base": key}
    packages: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # wheel name -> version -> {"file", "sha256"}
    wheels: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # relative path -> {"sha256", "size"}
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_file(self, root: Path, rel: str, sha256: str | None = None) -> str:
        path = root / rel
        digest = sha256 or sha256_file(path)
        self.files[rel] = {"sha256": digest, "size": path.stat().st_size}
        return digest

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "images": self.images, "bases": self.bases, "packages": self.packages,
                "wheels": self.wheels, "files": dict(sorted(self.files.items()))}

    def write(self, root: Path) -> None:
        """The index into root, whole or not at all: a temporary file renamed over it."""
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{INDEX}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, root / INDEX)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def base_file(self, key: str) -> tuple[str, str]:
        """(the tarball of base `key`, relative to the mirror; the sha256 the index's files give it):
        what an offline build imports the base from and checks it against, right before the import."""
        rel = self.bases.get(key)
        if rel is None or rel not in self.files:
            raise UsageError(f"the mirror has no checked file for base {key[:12]}; {REMEDY}")
        return rel, str(self.files[rel]["sha256"])

    def base_files(self) -> dict[str, tuple[str, str]]:
        """base key -> (tarball relative to the mirror, its sha256): `base_file` of every base."""
        return {key: self.base_file(key) for key in self.bases}


def _bad(root: Path, what: str) -> UsageError:
    return UsageError(f"mirror {root}: {what}; {REMEDY}")


def _document(root: Path) -> Any:
    path = root / INDEX
    try:
        os.lstat(path)
    except OSError as e:
        raise _bad(root, f"no readable index {INDEX} ({e.strerror})") from None
    doc = documents.parse_json(documents.read_bytes(path, WHAT, REMEDY), path, WHAT, REMEDY)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _bad(root, f"{INDEX} is not a nodeforge mirror index of format {FORMAT}")
    return doc


def read(root: Path) -> Index:
    """The index of a mirror directory, its shape checked (exit 2 naming each key that is wrong),
    without checking the files."""
    if not root.is_dir():
        raise UsageError(f"--mirror {root}: no such directory; make one with `nodeforge mirror IMAGE... DIR`")
    path = root / INDEX
    doc = documents.check(_document(root), INDEX_SPEC, path, WHAT, REMEDY)
    problems = cross_problems(doc, str(path), REMEDY)
    if problems:
        raise UsageError(f"{WHAT} {path}: {len(problems)} problem{'s' if len(problems) != 1 else ''}", problems)
    packages = {name: {version: {k: v for k, v in entry.items() if v is not None}
                       for version, entry in versions.items()}
                for name, versions in doc["packages"].items()}
    return Index(doc["images"], doc["bases"], packages, doc["wheels"], doc["files"])


def _present(root: Path) -> set[str]:
    """Every entry of the mirror but the index and its directories: files, FIFOs, devices and
    symbolic links (to directories too: os.walk does not follow them)."""
    found = set()
    for d, dirs, names in os.walk(root):
        for n in names + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            rel = str((Path(d) / n).relative_to(root))
            if rel != INDEX:
                found.add(rel)
    return found


def open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file rel under root, reached without following a
    symbolic link and never opened when it is not a regular file; OSError otherwise (ELOOP: a
    symbolic link on the way, EINVAL: not a regular file)."""
    *dirs, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in dirs:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY, dir_fd=fd)
    finally:
        os.close(fd)


def _file_problem(root: Path, rel: str, want: dict[str, Any]) -> str:
    """'' when rel is a regular file of the index's size and sha256, else what is wrong."""
    try:
        fd = open_regular(root, rel)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return "missing"
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return "reached through a symbolic link or a non-directory: a mirror holds regular files only"
        if e.errno == errno.EINVAL:
            return "not a regular file (a FIFO, device or directory): a mirror holds regular files only"
        return f"cannot be read ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file: a mirror holds regular files only"
        if st.st_size != want["size"]:
            return f"sha256 differs from the index (size {st.st_size}, the index says {want['size']})"
        h = hashlib.sha256()
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return "" if h.hexdigest() == want["sha256"] else "sha256 differs from the index"


def check(root: Path) -> Index:
    """The index, once every file it lists is a regular file with its sha256 and size and no other
    file is there; otherwise exit 2 naming the first files that differ."""
    index = read(root)
    problems = [f"{rel}: not in the index" for rel in sorted(_present(root) - set(index.files))]
    for rel, want in sorted(index.files.items()):
        why = _file_problem(root, rel, want)
        if why:
            problems.append(f"{rel}: {why}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise _bad(root, "the index check failed: " + "; ".join(problems[:5]) + more)
    return index
