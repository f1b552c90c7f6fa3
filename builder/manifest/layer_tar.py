"""One image layer rewritten so that two clean builds give the same bytes: entries sorted by name
(a file with several names held by the first, the others hard links after it), times clamped to
SOURCE_DATE_EPOCH, numeric owners only, no pax times, build-host leftovers dropped. Layers are
published uncompressed (the OCI media type ...layer.v1.tar): the digest then depends on the tar
alone, not on a compressor's version or level, and computing it costs a hash instead of a
compression of every layer."""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import os
import struct
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# written by the package tools at build time; they differ between any two builds
DROPPED = (
    "var/cache/ldconfig/aux-cache",
    "var/log/dpkg.log",
    "var/log/alternatives.log",
    "var/log/apt/*",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
    "var/lib/dkms/*/log/make.log",  # DKMS's build log: the date and the build container's name
)
# generated once per machine (systemd's postinst writes one at build time): empty in an image, so
# that each machine or container makes its own on first boot, as systemd expects
EMPTIED = ("etc/machine-id",)
_KEPT_PAX = "SCHILY.xattr."  # extended attributes (file capabilities) stay; times and names go


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:... of the layer blob (the uncompressed tar: the same as diff_id)
    diff_id: str  # sha256:... of the uncompressed tar
    size: int  # bytes of the blob


class _Hashing:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.out.flush()


def dropped(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in DROPPED)


def stale_pyc(name: str, head: bytes, epoch: int) -> bool:
    """A timestamp-based .pyc compiled from a source written during the build: once the source's
    time is clamped, Python no longer accepts it (and its bytes name the build's clock), so it goes.
    A .pyc of a packaged source (time before the epoch) or a hash-based one stays."""
    if not name.endswith(".pyc") or "__pycache__/" not in name or len(head) < 16:
        return False
    flags, source_mtime = struct.unpack("<II", head[4:12])
    return flags & 1 == 0 and source_mtime > epoch


def _entry(m: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    e = tarfile.TarInfo(m.name)
    e.type, e.mode, e.uid, e.gid = m.type, m.mode, m.uid, m.gid
    e.size = m.size if m.isreg() else 0
    e.devmajor, e.devminor = m.devmajor, m.devminor
    # a hard link names a member (without ./, as the members are); a regular file has no link name
    # (the engine gives a whiteout one where the overlay links them all to one inode)
    e.linkname = m.linkname.removeprefix("./") if m.islnk() else m.linkname if m.issym() else ""
    e.mtime = min(int(m.mtime), epoch)
    e.uname = e.gname = ""
    e.pax_headers = {k: m.pax_headers[k] for k in sorted(m.pax_headers) if k.startswith(_KEPT_PAX)}
    return e


Opener = Callable[[], IO[bytes]] | None


def _opener(src: tarfile.TarFile, m: tarfile.TarInfo) -> Opener:
    def read() -> IO[bytes]:
        f = src.extractfile(m)
        assert f is not None
        return f
    return read if m.isreg() else None


def kept(entries: Iterable[tuple[tarfile.TarInfo, Opener]], epoch: int) -> list[tuple[tarfile.TarInfo, Opener]]:
    """The entries that stay (each with what opens its data), in their written order: sorted by
    name, hard links last."""
    out, gone = [], set()
    for m, data in entries:
        name = m.name.removeprefix("./")
        pyc = data is not None and m.isreg() and name.endswith(".pyc")
        if name in ("", ".") or dropped(name) or (pyc and data is not None and stale_pyc(name, _head(data), epoch)):
            gone.add(name)
        else:
            out.append((m, data))
    out = [(m, d) for m, d in out if not (m.islnk() and m.linkname.removeprefix("./") in gone)]
    return sorted(_first_names_hold_data(out), key=lambda e: (e[0].islnk(), e[0].name.removeprefix("./")))


def _first_names_hold_data(out: list[tuple[tarfile.TarInfo, Opener]]) -> list[tuple[tarfile.TarInfo, Opener]]:
    """Each file with several names stored under the first of them (by name), the others links to
    it: which name a tar holds the data under depends on the order it was written in (a directory
    walk, a bootstrap's tar), not on the content."""
    def name(m: tarfile.TarInfo) -> str:
        return m.name.removeprefix("./")

    regular = {name(m): (m, d) for m, d in out if m.isreg()}
    names: dict[str, list[str]] = {}
    for m, _ in out:
        if m.islnk() and m.linkname.removeprefix("./") in regular:
            names.setdefault(m.linkname.removeprefix("./"), []).append(name(m))
    first = {held: min(others) for held, others in names.items() if min(others) < held}
    if not first:
        return out
    result: list[tuple[tarfile.TarInfo, Opener]] = []
    for m, d in out:
        if m.isreg() and name(m) in first:  # now a link to the first name
            link = copy.copy(m)
            link.type, link.linkname, link.size = tarfile.LNKTYPE, first[name(m)], 0
            result.append((link, None))
        elif m.islnk() and m.linkname.removeprefix("./") in first:
            held = m.linkname.removeprefix("./")
            if name(m) == first[held]:  # now holds the data
                data_m, data = regular[held]
                entry = copy.copy(data_m)
                entry.name = m.name
                result.append((entry, data))
            else:
                link = copy.copy(m)
                link.linkname = first[held]
                result.append((link, None))
        else:
            result.append((m, d))
    return result


def _head(data: Callable[[], IO[bytes]]) -> bytes:
    with data() as f:
        return f.read(16)


def write(entries: Iterable[tuple[tarfile.TarInfo, Opener]], out: Path | None, epoch: int) -> Blob:
    """The normalised tar of `entries` written to `out` (None: only its digests and size)."""
    with open(out if out is not None else os.devnull, "wb") as raw:
        plain = _Hashing(raw)
        with tarfile.TarFile(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[arg-type]
                             encoding="utf-8") as dst:
            for m, data in kept(entries, epoch):
                e = _entry(m, epoch)
                e.name = m.name.removeprefix("./")
                if m.isreg() and e.name in EMPTIED:
                    e.size = 0
                if e.size and data is not None:
                    with data() as f:
                        dst.addfile(e, f)
                else:
                    dst.addfile(e, None)
    digest = f"sha256:{plain.sha.hexdigest()}"
    return Blob(digest, digest, plain.size)


def normalise(layer: Path, out: Path | None, epoch: int) -> Blob:
    """Write `layer` (an uncompressed tar) normalised to `out` (None: only its digests and size,
    nothing written)."""
    with tarfile.open(layer) as src:
        return write(((m, _opener(src, m)) for m in src.getmembers()), out, epoch)
