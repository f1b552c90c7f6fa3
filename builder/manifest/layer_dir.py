"""An image layer read from the engine's own overlay2 directory instead of `docker save`: the
entries the engine's tar of that directory has (moby's archive package: names in lexical walk
order, a second name of a file as a hard link to the first, permission bits only, times truncated
to the second, security.capability as the only extended attribute, sockets skipped, an overlay
whiteout as an empty `.wh.` file of mode 0600, an opaque directory marked by an empty
`.wh..wh..opq` file of time 0), so that layer_tar normalises them to the same bytes. Only the
layers not normalised before are read, and nothing is written to disk.

An overlay redirect or metadata-only copy is not read this way: Unsupported, and the caller uses
`docker save`."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .layer_tar import Opener

WHITEOUT_PREFIX = ".wh."
_CAPABILITY = "security.capability"
_OPAQUE = "trusted.overlay.opaque"
_INDIRECT = ("trusted.overlay.redirect", "trusted.overlay.metacopy")
OPAQUE_MARK = ".wh..wh..opq"


class Unsupported(Exception):
    pass


def _pax_value(raw: bytes) -> str:  # as tarfile decodes a pax value it reads back
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape")


def _reader(path: str) -> Opener:
    def read() -> IO[bytes]:
        return open(path, "rb")
    return read


def entries(top: Path) -> Iterator[tuple[tarfile.TarInfo, Opener]]:
    """The engine's tar entries of the layer directory `top`, in its order."""
    seen: dict[tuple[int, int], str] = {}

    def walk(rel: str) -> Iterator[tuple[tarfile.TarInfo, Opener]]:
        with os.scandir(os.path.join(top, rel) if rel else top) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path_rel = f"{rel}/{name}" if rel else name
            path = os.path.join(top, path_rel)
            st = os.lstat(path)
            try:
                attrs = os.listxattr(path, follow_symlinks=False)
            except OSError:
                attrs = []
            if any(a in _INDIRECT for a in attrs):
                raise Unsupported(f"{path_rel}: an overlay redirect or metadata-only copy")
            if stat.S_ISSOCK(st.st_mode):
                continue
            info = tarfile.TarInfo(path_rel)
            info.mode, info.uid, info.gid, info.mtime = st.st_mode & 0o7777, st.st_uid, st.st_gid, int(st.st_mtime)
            data: Opener = None
            if stat.S_ISREG(st.st_mode):
                info.type, info.size, data = tarfile.REGTYPE, st.st_size, _reader(path)
            elif stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
                info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            elif stat.S_ISFIFO(st.st_mode):
                info.type = tarfile.FIFOTYPE
            if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:  # whiteouts too: overlay links them all
                inode = (st.st_dev, st.st_ino)
                if inode in seen:
                    info.type, info.linkname, info.size, data = tarfile.LNKTYPE, seen[inode], 0, None
                else:
                    seen[inode] = path_rel
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: its link name, if any, stays
                info.name = f"{rel}/{WHITEOUT_PREFIX}{name}" if rel else f"{WHITEOUT_PREFIX}{name}"
                info.type, info.mode, info.size, info.devmajor, info.devminor = tarfile.REGTYPE, 0o600, 0, 0, 0
            if _CAPABILITY in attrs:
                info.pax_headers = {f"SCHILY.xattr.{_CAPABILITY}":
                                    _pax_value(os.getxattr(path, _CAPABILITY, follow_symlinks=False))}
            yield info, data
            if stat.S_ISDIR(st.st_mode):
                if _OPAQUE in attrs and os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y":
                    mark = tarfile.TarInfo(f"{path_rel}/{OPAQUE_MARK}")  # the engine's: no time at all
                    mark.mode, mark.uid, mark.gid, mark.mtime = st.st_mode & 0o777, st.st_uid, st.st_gid, 0
                    yield mark, None
                yield from walk(path_rel)

    yield from walk("")
