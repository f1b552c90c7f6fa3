"""The root archive of a netboot node: the tar GNU tar makes of the tree (tar_command: sorted
names, every time the epoch, numeric owners, extended attributes, no atime or ctime), compressed
as a series of gzip members.

gzip allows members one after another (RFC 1952 2.2; busybox's tar in the netboot initramfs, GNU
gzip and Python all read them as one stream). The tree is walked here in tar's own order and its
entries cut into chunks by their metadata alone (a cut after a name whose hash picks it, once a
chunk's estimated size is CHUNK_MIN; always after the entry that crosses CHUNK_MAX): each chunk is
the tar bytes of its names, compressed on its own and kept by its content's sha256.

An unchanged chunk is not read at all. Each chunk has a signature made of its entries' metadata
(name, inode, size, mode, owners, modification and change times, link count; the first name of a
hard link it refers to) and the tar options; the stat index of an image maps the signatures of its
last archive to their chunks' keys, as git's index and rsync's quick check do. An engine layer's
files keep their inode and times from build to build, so an edit reads only the files of the
chunks it touched. A chunk holding a file changed less than RACY_S before the walk is never
entered in the index (git's racy-clean rule: a change within the clock's granularity could keep
every time). A chunk not in the index is made by GNU tar given exactly its names (--no-recursion):
an entry's bytes depend on that entry alone, except a hard link, whose first name (in an earlier
chunk) is given to tar first and its entry dropped, so that tar writes the link as it would in
one run. Cold and incremental builds make the same bytes, the bytes of one tar run over the tree
(tests/unit/test_root_archive.py compares them), compressed by chunk (zlib level 1 with a fixed
header: no name, no time)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildFailed

BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking: the archive is padded to whole records
CHUNK_MIN = 4 << 20  # a cut needs at least this much (estimated) since the last
CHUNK_MAX = 32 << 20  # and is made after the entry that crosses this, whatever its name
CUT_EVERY = 64  # about one name in this many ends a chunk (once CHUNK_MIN is reached)
RACY_S = 2.0  # a chunk with a change this recent is made again next time, whatever its signature
_PREFIXES = {b"x", b"g", b"L", b"K"}  # headers that belong to the entry after them
INDEX_FORMAT = 1  # bumped when the signature's meaning changes: every old stat index then misses


def tar_options(epoch: str) -> list[str]:
    return ["--numeric-owner", f"--mtime=@{epoch}",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime", "--xattrs",
            "--format=posix"]


def tar_command(rootfs: Path, epoch: str) -> list[str]:
    """One tar run over the whole tree: what the archive's bytes are, decompressed."""
    return ["tar", "-C", str(rootfs), "--sort=name", *tar_options(epoch), "-cf", "-", "."]


@functools.cache
def _tar_version() -> str:
    p = subprocess.run(["tar", "--version"], capture_output=True, text=True)
    return p.stdout.splitlines()[0] if p.returncode == 0 and p.stdout else "unknown tar"


@dataclass(frozen=True)
class Entry:
    name: bytes  # as tar writes it: ./etc/hostname
    estimate: int  # its share of the tar stream, from its metadata (header and data blocks)
    signature: bytes  # what its tar bytes depend on, from lstat
    changed: float  # its change time (st_ctime)
    link_to: bytes | None = None  # the first name of its hard link, where that is an earlier name
    archived: bool = True  # tar writes no entry for a socket


def walk(rootfs: Path) -> list[Entry]:
    """Every name in the tree, in the order of tar --sort=name (a directory's names sorted by their
    bytes, each directory's contents right after it), never following a symbolic link."""
    entries: list[Entry] = []
    first_link: dict[tuple[int, int], bytes] = {}
    top = os.fsencode(rootfs)

    def add(name: bytes, st: os.stat_result) -> None:
        mode = st.st_mode
        link_to = None
        size = st.st_size if stat.S_ISREG(mode) else 0
        if not stat.S_ISDIR(mode) and not stat.S_ISSOCK(mode) and st.st_nlink > 1:
            ident = (st.st_dev, st.st_ino)
            if ident in first_link:
                link_to, size = first_link[ident], 0
            else:
                first_link[ident] = name
        signature = b"\0".join([name, link_to or b"", b"%d %d %d %d %d %d %d %d %d" % (
            mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink,
            st.st_rdev)])
        estimate = BLOCK + -(-size // BLOCK) * BLOCK + (BLOCK if len(name) > 99 else 0)
        entries.append(Entry(name, estimate, signature, st.st_ctime, link_to, not stat.S_ISSOCK(mode)))

    def visit(name: bytes, path: bytes, st: os.stat_result) -> None:
        add(name, st)
        if stat.S_ISDIR(st.st_mode):
            for child in sorted(os.listdir(path)):
                child_path = path + b"/" + child
                visit(name + b"/" + child, child_path, os.lstat(child_path))

    visit(b".", top, os.lstat(top))
    return entries


def cut(entries: list[Entry]) -> list[list[Entry]]:
    out: list[list[Entry]] = []
    chunk: list[Entry] = []
    size = 0
    for e in entries:
        chunk.append(e)
        size += e.estimate
        if size >= CHUNK_MAX or (size >= CHUNK_MIN and zlib.crc32(e.name) % CUT_EVERY == 0):
            out.append(chunk)
            chunk, size = [], 0
    if chunk:
        out.append(chunk)
    return out


def signature_prefix(epoch: str) -> bytes:
    """What every chunk's signature starts with: the index format, the tar and its options."""
    return f"{INDEX_FORMAT}\0{_tar_version()}\0{' '.join(tar_options(epoch))}\0".encode()


def signature(chunk: list[Entry], prefix: bytes) -> str:
    h = hashlib.sha256(prefix)
    for e in chunk:
        h.update(e.signature)
        h.update(b"\n")
    return h.hexdigest()


def _size(header: bytes) -> int:
    field = header[124:136]
    if field[0] & 0x80:  # base-256
        return int.from_bytes(field[1:], "big")
    return int(field.rstrip(b"\0 ").strip() or b"0", 8)


def split_entries(data: bytes) -> Iterator[bytes]:
    """The entries of a tar stream (each with the extended headers before it), up to its end blocks."""
    pos, start = 0, 0
    while pos + BLOCK <= len(data):
        header = data[pos:pos + BLOCK]
        if header == bytes(BLOCK):
            return
        pos += BLOCK + -(-_size(header) // BLOCK) * BLOCK
        if pos > len(data):
            break
        if header[156:157] in _PREFIXES:
            continue
        yield data[start:pos]
        start = pos
    raise BuildFailed("making the root archive failed: tar's output ended early")


def tar_chunk(rootfs: Path, chunk: list[Entry], epoch: str) -> bytes:
    """The bytes one tar run over the whole tree writes for these entries."""
    inside = {e.name for e in chunk}
    before = list(dict.fromkeys(e.link_to for e in chunk if e.link_to is not None and e.link_to not in inside))
    names = [*before, *(e.name for e in chunk)]
    p = subprocess.run(["tar", "-C", str(rootfs), *tar_options(epoch), "-cf", "-", "--null",
                        "--verbatim-files-from", "--no-recursion", "-T", "-"],
                       input=b"".join(n + b"\0" for n in names), capture_output=True)
    if p.returncode != 0:
        raise BuildFailed(f"making the root archive failed: {p.stderr.decode(errors='replace').strip()[-400:]}")
    made = list(split_entries(p.stdout))
    wanted = len(before) + sum(e.archived for e in chunk)
    if len(made) != wanted:
        raise BuildFailed(f"making the root archive failed: tar wrote {len(made)} entries for {wanted} names "
                          f"(from {chunk[0].name.decode(errors='replace')}); did the tree change meanwhile?")
    return b"".join(made[len(before):])


def end_blocks(length: int) -> bytes:
    """What tar writes after its last entry: two zero blocks, then zeros to a whole record."""
    return bytes(-(-(length + 2 * BLOCK) // RECORD) * RECORD - length)


def compress(data: bytes) -> bytes:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: the gzip wrapper, mtime 0 and no name
    return z.compress(data) + z.flush()


class ChunkCache:
    """build/cache/archive-chunks/<sha256 of the tar chunk>.gz; index/<image>.json lists the chunks
    of an image's last archive (chunks no index lists are removed after each archive), and
    stat/<image>.json maps its chunks' signatures to their keys, with each chunk's tar length."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "index").mkdir(parents=True, exist_ok=True)
        (root / "stat").mkdir(parents=True, exist_ok=True)

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

    def known(self, image: str) -> dict[str, list[object]]:
        try:
            index = json.loads((self.root / "stat" / f"{image}.json").read_text())
        except (OSError, ValueError):
            return {}
        return index if isinstance(index, dict) else {}

    def _write(self, path: Path, value: object) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)

    def keep(self, image: str, keys: list[str], signatures: dict[str, list[object]] | None = None) -> None:
        self._write(self.root / "stat" / f"{image}.json", signatures or {})
        self._write(self.root / "index" / f"{image}.json", keys)
        wanted: set[str] = set()
        for other in (self.root / "index").glob("*.json"):
            try:
                wanted.update(json.loads(other.read_text()))
            except (OSError, ValueError):
                continue
        for chunk in self.root.glob("*.gz"):
            if chunk.stem not in wanted:
                chunk.unlink(missing_ok=True)


@dataclass
class _Made:
    key: str
    length: int  # of the tar bytes
    member: bytes
    read: bool  # made by tar from the tree, not taken by its signature


def _make(cache: ChunkCache, rootfs: Path, chunk: list[Entry], epoch: str, known: list[object] | None) -> _Made:
    if known and len(known) == 2 and isinstance(known[0], str) and isinstance(known[1], int):
        member = cache.get(known[0])
        if member is not None:
            return _Made(known[0], known[1], member, False)
    data = tar_chunk(rootfs, chunk, epoch)
    key = hashlib.sha256(data).hexdigest()
    member = cache.get(key)
    if member is None:
        member = compress(data)
        cache.put(key, member)
    return _Made(key, len(data), member, True)


def root_archive(rootfs: Path, dest: Path, epoch: str, cache: ChunkCache, image: str) -> tuple[str, str]:
    """Write the root archive to dest; (its sha256, how many chunks were taken unread)."""
    started = time.time()
    chunks = cut(walk(rootfs))
    known, prefix = cache.known(image), signature_prefix(epoch)
    h = hashlib.sha256()
    keys: list[str] = []
    signatures: dict[str, list[object]] = {}
    pending: list[tuple[str, bool, Future[_Made]]] = []
    length = unread = 0
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="nodeforge-archive") as pool, dest.open("wb") as out:
        def drain(limit: int) -> None:
            nonlocal length, unread
            while len(pending) > limit:
                sig, settled, future = pending.pop(0)
                made = future.result()
                keys.append(made.key)
                if settled:
                    signatures[sig] = [made.key, made.length]
                length += made.length
                unread += not made.read
                h.update(made.member)
                out.write(made.member)

        for chunk in chunks:
            sig = signature(chunk, prefix)
            settled = all(e.changed < started - RACY_S for e in chunk)
            pending.append((sig, settled, pool.submit(_make, cache, rootfs, chunk, epoch, known.get(sig))))
            drain(3)  # a few chunks in flight: memory stays bounded
        drain(0)
        tail = compress(end_blocks(length))
        h.update(tail)
        out.write(tail)
    cache.keep(image, keys, signatures)
    return h.hexdigest(), f"{unread}/{len(keys)} chunks unchanged, not read"
