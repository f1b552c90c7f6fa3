"""The files of a partitioned disk image (GPT), read without mounting: ext4 partitions with
debugfs (at the partition's offset), FAT partitions with mtools; any other partition as one blob."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from .entry import Entry

FileLister = Callable[[Path], dict[str, Entry]]


def is_gpt_disk(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(512)
        return f.read(8) == b"EFI PART"


def _partitions(disk: Path) -> list[tuple[str, int, int]]:
    """(name, offset, size) in bytes of each partition; empty when sfdisk cannot read the table."""
    if shutil.which("sfdisk") is None:
        return []
    proc = subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True, text=True)
    if proc.returncode != 0:
        return []
    table = json.loads(proc.stdout)["partitiontable"]
    sector = int(table.get("sectorsize", 512))
    return [(p.get("name") or Path(p["node"]).name, int(p["start"]) * sector, int(p["size"]) * sector)
            for p in table.get("partitions", [])]


def _kind(disk: Path, offset: int) -> str:
    with disk.open("rb") as f:
        f.seek(offset)
        head = f.read(2048)
    if head[1080:1082] == b"\x53\xef":
        return "ext4"
    if head[0x52:0x57] == b"FAT32" or head[0x36:0x39] == b"FAT":
        return "fat"
    return "other"


def _copied_out(cmd: list[str], tmp: Path, tree_entries: FileLister) -> dict[str, Entry]:
    subprocess.run(cmd, capture_output=True, check=False)
    return tree_entries(tmp)


def _blob(disk: Path, offset: int, size: int) -> Entry:
    h = hashlib.sha256()
    with disk.open("rb") as f:
        f.seek(offset)
        left = size
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return Entry("partition", size, 0, 0, h.hexdigest())


def disk_entries(disk: Path, tree_entries: FileLister) -> dict[str, Entry]:
    """partition name + ':/' + path -> Entry for every file of every readable partition."""
    out: dict[str, Entry] = {}
    for name, offset, size in _partitions(disk):
        kind = _kind(disk, offset)
        with tempfile.TemporaryDirectory(prefix="nodeforge-part-") as tmp:
            if kind == "ext4" and shutil.which("debugfs"):
                files = _copied_out(["debugfs", "-R", f"rdump / {tmp}", f"{disk}?offset={offset}"], Path(tmp),
                                    tree_entries)
            elif kind == "fat" and shutil.which("mcopy"):
                files = _copied_out(["mcopy", "-s", "-n", "-m", "-i", f"{disk}@@{offset}", "::/", tmp], Path(tmp),
                                    tree_entries)
            else:
                files = {"": _blob(disk, offset, size)}
        out.update({f"{name}:/{path}": entry for path, entry in files.items()})
    return out
