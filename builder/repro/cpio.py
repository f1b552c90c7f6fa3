"""Reading an initramfs: several cpio archives (newc) one after another, the first ones (early
microcode) uncompressed, the last one compressed (zstd, gzip or xz), as the kernel reads it."""

from __future__ import annotations

import hashlib
import lzma
import shutil
import subprocess
import zlib
from pathlib import Path

from .entry import Entry

NEWC = (b"070701", b"070702")
GZIP, ZSTD, XZ = b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"\xfd7zXZ\x00"
TRAILER = "TRAILER!!!"
_HEADER = 110


def is_initramfs(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(6) in NEWC


def _align(n: int) -> int:
    return (n + 3) & ~3


def _decompress(data: bytes) -> bytes:
    if data.startswith(GZIP):
        return zlib.decompressobj(wbits=31).decompress(data)
    if data.startswith(XZ):
        return lzma.LZMADecompressor().decompress(data)
    if data.startswith(ZSTD):
        if shutil.which("zstd") is None:
            raise OSError("zstd is not installed: it is needed to read a zstd-compressed initramfs")
        return subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=False).stdout
    return b""


def _archive(data: bytes, pos: int, out: dict[str, Entry], number: int) -> int:
    """Read one newc archive starting at `pos` into `out`; returns the position after its trailer."""
    while pos + _HEADER <= len(data) and data[pos:pos + 6] in NEWC:
        fields = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, mtime, size, namesize = fields[1], fields[5], fields[6], fields[11]
        name = data[pos + _HEADER: pos + _HEADER + namesize - 1].decode(errors="surrogateescape")
        start = _align(pos + _HEADER + namesize)
        body = data[start:start + size]
        pos = _align(start + size)
        if name == TRAILER:
            return pos
        kind = {0o100000: "file", 0o040000: "dir", 0o120000: "link"}.get(mode & 0o170000, "other")
        key = name.removeprefix("./")
        if key in out:
            key = f"{key} (archive {number})"
        out[key] = Entry(kind, size if kind == "file" else 0, mode & 0o7777, mtime,
                         hashlib.sha256(body).hexdigest() if kind == "file" else "",
                         body.decode(errors="surrogateescape") if kind == "link" else "")
    return pos


def entries(data: bytes) -> dict[str, Entry]:
    """name -> Entry for every member of every archive (a name seen twice gets its archive number)."""
    out: dict[str, Entry] = {}
    pos, number = 0, 0
    while pos < len(data):
        while pos < len(data) and data[pos] == 0:
            pos += 1
        if data[pos:pos + 6] in NEWC:
            number += 1
            pos = _archive(data, pos, out, number)
            continue
        rest = _decompress(data[pos:])
        if rest:
            out.update({k if k not in out else f"{k} (compressed)": v for k, v in entries(rest).items()})
        break
    return out
