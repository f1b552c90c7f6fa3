"""The root archive of a netboot node: a tar of the tree (sorted names, every time the epoch,
numeric owners, extended attributes, no atime or ctime) compressed as a series of gzip members.

gzip allows members one after another (RFC 1952 2.2; busybox's tar in the netboot initramfs, GNU
gzip and Python all read them as one stream). The tar stream is cut into chunks after entries
chosen by their header alone (content-defined, as rsync's gzip does), each chunk compressed
on its own and kept by its content's sha256. A config edit changes the tar bytes of a few entries:
only their chunks are compressed again, the rest are taken from the cache. Cold and incremental
builds make the same bytes: the chunks depend only on the tar stream, the compression only on a
chunk's bytes (zlib level 1 with a fixed header: no name, no time)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from ..errors import BuildFailed

BLOCK = 512
CHUNK_MIN = 4 << 20  # a cut needs at least this much since the last
CHUNK_MAX = 32 << 20  # and is made after the entry that crosses this, whatever its header
CUT_EVERY = 64  # about one entry header in this many ends a chunk (once CHUNK_MIN is reached)
_PREFIXES = {b"x", b"g", b"L", b"K"}  # headers that belong to the entry after them


def tar_command(rootfs: Path, epoch: str) -> list[str]:
    return ["tar", "-C", str(rootfs), "--numeric-owner", "--sort=name", f"--mtime=@{epoch}",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime", "--xattrs",
            "--format=posix", "-cf", "-", "."]


def _size(header: bytes) -> int:
    field = header[124:136]
    if field[0] & 0x80:  # base-256
        return int.from_bytes(field[1:], "big")
    return int(field.rstrip(b"\0 ").strip() or b"0", 8)


def _read(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise BuildFailed("making the root archive failed: tar's output ended early")
    return data


def chunks(stream: IO[bytes]) -> Iterator[bytes]:
    """The tar stream in chunks, each ending after a whole entry; the last holds the end blocks."""
    buf = bytearray()
    while True:
        header = stream.read(BLOCK)
        if not header:
            break
        if len(header) != BLOCK:
            raise BuildFailed("making the root archive failed: tar's output is not in blocks")
        buf += header
        if header == bytes(BLOCK):  # the end of the archive: the rest are zero blocks
            buf += stream.read()
            break
        size = _size(header)
        buf += _read(stream, -(-size // BLOCK) * BLOCK)
        if header[156:157] in _PREFIXES:
            continue
        name_hash = zlib.crc32(header[:100] + header[345:500])
        if len(buf) >= CHUNK_MAX or (len(buf) >= CHUNK_MIN and name_hash % CUT_EVERY == 0):
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def compress(data: bytes) -> bytes:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: the gzip wrapper, mtime 0 and no name
    return z.compress(data) + z.flush()


class ChunkCache:
    """build/cache/archive-chunks/<sha256 of the tar chunk>.gz; index/<image>.json lists the chunks
    of an image's last archive, and chunks no index lists are removed after each archive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "index").mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.gz"

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except OSError:
            return None

    def put(self, key: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:12]}.", dir=self.root)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path(key))

    def keep(self, image: str, keys: list[str]) -> None:
        index = self.root / "index" / f"{image}.json"
        tmp = index.with_name(f".{index.name}.tmp")
        tmp.write_text(json.dumps(keys))
        os.replace(tmp, index)
        wanted: set[str] = set()
        for other in (self.root / "index").glob("*.json"):
            try:
                wanted.update(json.loads(other.read_text()))
            except (OSError, ValueError):
                continue
        for chunk in self.root.glob("*.gz"):
            if chunk.stem not in wanted:
                chunk.unlink(missing_ok=True)


def _compressed(cache: ChunkCache, key: str, data: bytes) -> tuple[bytes, bool]:
    cached = cache.get(key)
    if cached is not None:
        return cached, True
    member = compress(data)
    cache.put(key, member)
    return member, False


def root_archive(rootfs: Path, dest: Path, epoch: str, cache: ChunkCache, image: str) -> tuple[str, str]:
    """Write the root archive to dest; (its sha256, how many chunks were taken from the cache)."""
    h = hashlib.sha256()
    keys: list[str] = []
    tar = subprocess.Popen(tar_command(rootfs, epoch), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout
    pending: list[Future[tuple[bytes, bool]]] = []
    reused = 0
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="nodeforge-archive") as pool, dest.open("wb") as out:
        def drain(limit: int) -> None:
            nonlocal reused
            while len(pending) > limit:
                member, hit = pending.pop(0).result()
                reused += hit
                h.update(member)
                out.write(member)

        for data in chunks(tar.stdout):
            key = hashlib.sha256(data).hexdigest()
            keys.append(key)
            pending.append(pool.submit(_compressed, cache, key, data))
            drain(3)  # a few chunks in flight: memory stays bounded
        drain(0)
    err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
    if tar.wait() != 0:
        raise BuildFailed(f"making the root archive failed: {err.strip()[-400:]}")
    cache.keep(image, keys)
    return h.hexdigest(), f"{reused}/{len(keys)} chunks cached"
