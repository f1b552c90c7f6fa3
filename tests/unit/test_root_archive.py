"""The root archive in cached gzip members: one gzip stream to its readers, the same bytes cold and
warm, and a config edit compresses only the chunks it touched."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.node import archive
from builder.node.archive import ChunkCache, root_archive, tar_command
from builder.node.tree import layer_dirs

EPOCH = "1700000000"


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "CHUNK_MIN", 16 << 10)
    monkeypatch.setattr(archive, "CHUNK_MAX", 64 << 10)
    monkeypatch.setattr(archive, "CUT_EVERY", 4)


def tree(root: Path) -> Path:
    for d in range(12):
        sub = root / "usr" / f"lib{d:02d}"
        sub.mkdir(parents=True)
        for f in range(20):
            (sub / f"file{f:02d}.so").write_bytes(bytes([d, f]) * (1000 + 37 * f))
    (root / "etc" / "sysctl.d").mkdir(parents=True)
    (root / "etc" / "sysctl.d" / "90-nodeforge.conf").write_text("vm.swappiness = 10\n")
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "bin" / "sh").symlink_to("dash")
    return root


def plain_tar(rootfs: Path) -> bytes:
    return subprocess.run(tar_command(rootfs, EPOCH), capture_output=True, check=True).stdout


def test_members_read_as_one_gzip_stream_holding_the_whole_tar(tmp_path: Path, small_chunks: None) -> None:
    rootfs = tree(tmp_path / "root")
    dest = tmp_path / "rootfs.tar.gz"
    root_archive(rootfs, dest, EPOCH, ChunkCache(tmp_path / "cache"), "node")
    data = dest.read_bytes()
    assert data.count(b"\x1f\x8b\x08") >= 4  # several members
    assert gzip.decompress(data) == plain_tar(rootfs)
    names = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz").getnames()
    assert "./etc/sysctl.d/90-nodeforge.conf" in names
    listing = subprocess.run(["tar", "-tzf", str(dest)], capture_output=True, text=True, check=True).stdout
    assert "./usr/lib11/file19.so" in listing.splitlines()


def test_an_edit_recompresses_only_its_chunk_and_matches_a_cold_archive(tmp_path: Path,
                                                                        small_chunks: None) -> None:
    rootfs = tree(tmp_path / "root")
    warm = ChunkCache(tmp_path / "warm")
    _, first = root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, warm, "node")
    total = int(first.split("/")[1].split()[0])
    assert first.startswith("0/")
    (rootfs / "etc" / "sysctl.d" / "90-nodeforge.conf").write_text("vm.swappiness = 60\n")
    sha_warm, again = root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, warm, "node")
    reused = int(again.split("/")[0])
    assert total - 2 <= reused < total  # the edited chunk (and at most one neighbour) compressed again
    sha_cold, cold = root_archive(rootfs, tmp_path / "c.tar.gz", EPOCH, ChunkCache(tmp_path / "cold"), "node")
    assert cold.startswith("0/")
    assert sha_warm == sha_cold
    assert (tmp_path / "b.tar.gz").read_bytes() == (tmp_path / "c.tar.gz").read_bytes()


def test_chunks_no_archive_uses_are_removed(tmp_path: Path, small_chunks: None) -> None:
    rootfs = tree(tmp_path / "root")
    cache = ChunkCache(tmp_path / "cache")
    root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, cache, "node")
    before = {p.name for p in (tmp_path / "cache").glob("*.gz")}
    (rootfs / "etc" / "sysctl.d" / "90-nodeforge.conf").write_text("vm.swappiness = 61\n")
    root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, cache, "node")
    after = {p.name for p in (tmp_path / "cache").glob("*.gz")}
    assert before - after and after - before  # the old chunk went, the new one is kept
    assert len(after) == len(before)


def test_the_engine_layers_are_used_only_where_they_are_local_overlay2_directories(tmp_path: Path) -> None:
    upper, lower = tmp_path / "upper", tmp_path / "lower"
    upper.mkdir()
    lower.mkdir()
    info = {"GraphDriver": {"Name": "overlay2", "Data": {"UpperDir": str(upper), "LowerDir": str(lower)}}}
    assert layer_dirs(info) == [str(upper), str(lower)]
    assert layer_dirs({"GraphDriver": {"Name": "btrfs", "Data": {}}}) is None
    gone = {"GraphDriver": {"Name": "overlay2", "Data": {"UpperDir": str(tmp_path / "gone")}}}
    assert layer_dirs(gone) is None
