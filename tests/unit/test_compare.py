"""The built-in comparison of two builds' outputs: identical directories report nothing; a differing
tar or initramfs (concatenated cpio archives, the last one compressed) is opened and the one
differing file inside it named."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.repro import compare, cpio


def newc(files: dict[str, bytes], mtime: int = 1735689600) -> bytes:
    out = b""
    for i, (name, data) in enumerate([*files.items(), ("TRAILER!!!", b"")]):
        mode = 0o100644 if name != "TRAILER!!!" else 0
        fields = [i + 1, mode, 0, 0, 1, mtime, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        header = b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
        out += header + b"\0" * (-len(header) % 4) + data + b"\0" * (-len(data) % 4)
    return out


def initramfs(main: dict[str, bytes], compress: str = "gzip") -> bytes:
    early = newc({"kernel/x86/microcode/GenuineIntel.bin": b"ucode"})
    packed = newc(main)
    if compress == "gzip":
        packed = gzip.compress(packed, mtime=0)
    else:
        packed = subprocess.run(["zstd", "-q", "-c"], input=packed, capture_output=True, check=True).stdout
    return early + packed


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1735689600
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def outputs(d: Path, build_time: bytes, compress: str = "gzip") -> Path:
    d.mkdir()
    (d / "SHA256SUMS").write_text("same\n")
    (d / "rootfs.tar").write_bytes(tar_bytes({"etc/hostname": b"node\n", "etc/build-time": build_time}))
    (d / "initrd.img").write_bytes(initramfs({"init": b"#!/bin/sh\n", "etc/build-time": build_time}, compress))
    return d


def test_identical_outputs_compare_equal(tmp_path: Path) -> None:
    a, b = outputs(tmp_path / "a", b"1\n"), outputs(tmp_path / "b", b"1\n")
    assert compare.compare_dirs(a, b, diffoscope=False) == []


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_the_differing_file_inside_tar_and_initramfs_is_named(tmp_path: Path, compress: str) -> None:
    if compress == "zstd" and shutil.which("zstd") is None:
        pytest.skip("zstd is not installed")
    a = outputs(tmp_path / "a", b"Thu Dec  3 17:00:00 UTC 2026\n", compress)
    b = outputs(tmp_path / "b", b"Thu Dec  3 17:00:09 UTC 2026\n", compress)
    lines = compare.compare_dirs(a, b, diffoscope=False)
    text = "\n".join(lines)
    assert "SHA256SUMS" not in text
    assert "initrd.img differs:" in lines and "rootfs.tar differs:" in lines
    inner = [line.strip() for line in lines if line.strip().startswith("differs:")]
    assert inner == ["differs: etc/build-time", "differs: etc/build-time"]


def test_a_file_only_in_one_build_is_named(tmp_path: Path) -> None:
    a, b = outputs(tmp_path / "a", b"1\n"), outputs(tmp_path / "b", b"1\n")
    (b / "extra.qcow2").write_bytes(b"x")
    assert compare.compare_dirs(a, b, diffoscope=False) == ["only in B: extra.qcow2"]


def test_every_archive_of_an_initramfs_is_read() -> None:
    entries = cpio.entries(initramfs({"init": b"#!/bin/sh\n", "usr/lib/modules/x.ko": b"\x7fELF"}))
    assert sorted(entries) == ["init", "kernel/x86/microcode/GenuineIntel.bin", "usr/lib/modules/x.ko"]
    assert entries["init"].kind == "file" and entries["init"].size == 10


def test_plain_files_that_differ_are_named_by_hash(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "vmlinuz").write_bytes(b"kernel-1")
    (tmp_path / "b" / "vmlinuz").write_bytes(b"kernel-2")
    lines = compare.compare_dirs(tmp_path / "a", tmp_path / "b", diffoscope=False)
    assert lines[0] == "vmlinuz differs:" and lines[1].strip().startswith("sha256 ")
