"""One image layer rewritten so that two clean builds give the same bytes: entries sorted by name
(hard links after the files they point to), times clamped to SOURCE_DATE_EPOCH, numeric owners
only, no pax times, build-host leftovers dropped. Layers are published uncompressed (the OCI
media type ...layer.v1.tar): the digest then depends on the tar alone, not on a compressor's
version or level, and computing it costs a hash instead of a compression of every layer."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import struct
import tarfile
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
    e.linkname, e.devmajor, e.devminor = m.linkname, m.devmajor, m.devminor
    e.mtime = min(int(m.mtime), epoch)
    e.uname = e.gname = ""
    e.pax_headers = {k: m.pax_headers[k] for k in sorted(m.pax_headers) if k.startswith(_KEPT_PAX)}
    return e


def kept_members(src: tarfile.TarFile, epoch: int) -> list[tarfile.TarInfo]:
    """The entries that stay, in their written order: sorted by name, hard links last."""
    kept, gone = [], set()
    for m in src.getmembers():
        name = m.name.removeprefix("./")
        f = src.extractfile(m) if m.isreg() and name.endswith(".pyc") else None
        if dropped(name) or (f is not None and stale_pyc(name, f.read(16), epoch)):
            gone.add(name)
        else:
            kept.append(m)
    kept = [m for m in kept if not (m.islnk() and m.linkname.removeprefix("./") in gone)]
    return sorted(kept, key=lambda m: (m.islnk(), m.name.removeprefix("./")))


def normalise(layer: Path, out: Path | None, epoch: int) -> Blob:
    """Write `layer` (an uncompressed tar) normalised to `out` (None: only its digests and size,
    nothing written)."""
    with tarfile.open(layer) as src, open(out if out is not None else os.devnull, "wb") as raw:
        plain = _Hashing(raw)
        with tarfile.TarFile(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[arg-type]
                             encoding="utf-8") as dst:
            for m in kept_members(src, epoch):
                e = _entry(m, epoch)
                e.name = m.name.removeprefix("./")
                if m.isreg() and e.name in EMPTIED:
                    e.size = 0
                dst.addfile(e, src.extractfile(m) if e.size else None)
    digest = f"sha256:{plain.sha.hexdigest()}"
    return Blob(digest, digest, plain.size)
