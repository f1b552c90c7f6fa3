"""The root archive in cached gzip members: one gzip stream to its readers, the bytes of one GNU tar
run over the tree cold and warm, and a config edit reads and compresses only the chunks it touched."""

from __future__ import annotations

import gzip
import io
import os
import stat
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


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file taken as changed long ago (a test's files are seconds old): chunks enter the index."""
    monkeypatch.setattr(archive, "RACY_S", -3600.0)


@pytest.fixture
def tar_runs(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The first name of every chunk tar was run for."""
    runs: list[bytes] = []
    real = archive.tar_chunk

    def counted(rootfs: Path, chunk: list[archive.Entry], epoch: str) -> bytes:
        runs.append(chunk[0].name)
        return real(rootfs, chunk, epoch)

    monkeypatch.setattr(archive, "tar_chunk", counted)
    return runs


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


def test_an_edit_recompresses_only_its_chunk_and_matches_a_cold_archive(tmp_path: Path, small_chunks: None,
                                                                        settled: None) -> None:
    rootfs = tree(tmp_path / "root")
    warm = ChunkCache(tmp_path / "warm")
    _, first = root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, warm, "node")
    total = int(first.split("/")[1].split()[0])
    assert first.startswith("0/")
    (rootfs / "etc" / "sysctl.d" / "90-nodeforge.conf").write_text("vm.swappiness = 100\n")
    sha_warm, again = root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, warm, "node")
    reused = int(again.split("/")[0])
    assert total - 2 <= reused < total  # the edited chunk (and at most one neighbour) compressed again
    sha_cold, cold = root_archive(rootfs, tmp_path / "c.tar.gz", EPOCH, ChunkCache(tmp_path / "cold"), "node")
    assert cold.startswith("0/")
    assert sha_warm == sha_cold
    assert (tmp_path / "b.tar.gz").read_bytes() == (tmp_path / "c.tar.gz").read_bytes()


def test_chunks_no_archive_uses_are_removed(tmp_path: Path, small_chunks: None, settled: None) -> None:
    rootfs = tree(tmp_path / "root")
    cache = ChunkCache(tmp_path / "cache")
    root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, cache, "node")
    before = {p.name for p in (tmp_path / "cache").glob("*.gz")}
    (rootfs / "etc" / "sysctl.d" / "90-nodeforge.conf").write_text("vm.swappiness = 101\n")
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


def odd_tree(root: Path) -> Path:
    """What tar writes in more than a header and data: long names and links, hard links far apart,
    extended attributes, devices, fifos, sockets (tar skips them), names no shell would quote."""
    tree(root)
    etc = root / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    os.link(etc / "passwd", root / "usr" / "lib00" / "a-hard-link")  # its first name comes later
    os.link(etc / "passwd", root / "zz-hard-link")
    deep = root / "opt" / ("d" * 90) / ("e" * 90)
    deep.mkdir(parents=True)
    (deep / ("f" * 120)).write_bytes(b"long name\n")
    (root / "opt" / "long-link").symlink_to("x" * 200)
    (root / "opt" / "back\\slash and space").write_text("1")
    (root / "opt" / "new\nline").write_text("2")
    (root / "opt" / "caf\u00e9").write_text("3")
    os.mkfifo(root / "opt" / "fifo")
    (root / "usr" / "bin" / "su").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "usr" / "bin" / "su", 0o4755)
    os.setxattr(etc / "sysctl.d" / "90-nodeforge.conf", "user.nodeforge", b"checked")
    if os.geteuid() == 0:
        os.mknod(root / "opt" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chown(root / "opt" / "caf\u00e9", 1234, 5678)
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "opt" / "socket"))
    return root


def test_the_archive_is_one_tar_run_over_the_tree_byte_for_byte(tmp_path: Path, small_chunks: None,
                                                                settled: None) -> None:
    rootfs = odd_tree(tmp_path / "root")
    cache = ChunkCache(tmp_path / "cache")
    root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, cache, "node")
    assert gzip.decompress((tmp_path / "a.tar.gz").read_bytes()) == plain_tar(rootfs)
    (rootfs / "zz-hard-link").write_text("root:x:0:0:root:/root:/bin/bash\n")  # all three names change
    root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, cache, "node")
    assert gzip.decompress((tmp_path / "b.tar.gz").read_bytes()) == plain_tar(rootfs)
    names = tarfile.open(tmp_path / "b.tar.gz").getmembers()
    links = {m.name: m.linkname for m in names if m.islnk()}
    assert links == {"./usr/lib00/a-hard-link": "./etc/passwd", "./zz-hard-link": "./etc/passwd"}


def test_an_unchanged_tree_is_not_read_and_a_tampered_index_only_costs_a_read(
        tmp_path: Path, small_chunks: None, settled: None, tar_runs: list[bytes]) -> None:
    rootfs = tree(tmp_path / "root")
    cache = ChunkCache(tmp_path / "cache")
    sha, _ = root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, cache, "node")
    total = len(tar_runs)
    tar_runs.clear()
    again, how = root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, cache, "node")
    assert (again, how, tar_runs) == (sha, f"{total}/{total} chunks unchanged, not read", [])
    for member in (tmp_path / "cache").glob("*.gz"):
        member.unlink()  # the index names chunks that are gone: they are made again
    third, how = root_archive(rootfs, tmp_path / "c.tar.gz", EPOCH, cache, "node")
    assert (third, how, len(tar_runs)) == (sha, f"0/{total} chunks unchanged, not read", total)


def test_a_chunk_changed_within_the_racy_window_is_read_again(tmp_path: Path, small_chunks: None,
                                                             tar_runs: list[bytes]) -> None:
    """A same-size edit that keeps the modification time, seconds after the last archive: the
    signature may not see it (the change time can fall in the same clock tick), so a chunk with a
    recent change is never taken unread."""
    rootfs = tree(tmp_path / "root")
    cache = ChunkCache(tmp_path / "cache")
    root_archive(rootfs, tmp_path / "a.tar.gz", EPOCH, cache, "node")
    conf = rootfs / "etc" / "sysctl.d" / "90-nodeforge.conf"
    st = conf.stat()
    conf.write_text("vm.swappiness = 60\n")
    os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))
    tar_runs.clear()
    _, how = root_archive(rootfs, tmp_path / "b.tar.gz", EPOCH, cache, "node")
    assert how.startswith("0/") and tar_runs
    assert gzip.decompress((tmp_path / "b.tar.gz").read_bytes()) == plain_tar(rootfs)
