"""A GPT disk image (an ESP and an ext4 root, written without mounting, as the assembler writes
them) is compared file by file: the one differing file in the root partition is named."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.repro import compare

TOOLS = ("sfdisk", "mkfs.ext4", "mkfs.vfat", "mcopy", "debugfs")
MIB = 1 << 20


def disk(path: Path, tmp: Path, build_time: str) -> Path:
    root, esp = tmp / "root", tmp / "esp"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("node\n")
    (root / "etc" / "build-time").write_text(build_time)
    (esp / "EFI").mkdir(parents=True)
    (esp / "EFI" / "grub.cfg").write_text("set timeout=0\n")
    for p in [*root.rglob("*"), root, *esp.rglob("*")]:
        os.utime(p, (1735689600, 1735689600))
    with path.open("wb") as f:
        f.truncate(40 * MIB)
    subprocess.run(["sfdisk", "-q", str(path)], input="label: gpt\nstart=1MiB, size=8MiB, type=U, name=esp\n"
                   "start=9MiB, size=30MiB, type=L, name=root\n", text=True, check=True)
    env = {"E2FSPROGS_FAKE_TIME": "1735689600", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["mkfs.vfat", "--invariant", "-n", "ESP", "--offset", str(2048), str(path), str(8 * 1024)],
                   check=True, capture_output=True, env={**env, "SOURCE_DATE_EPOCH": "1735689600"})
    subprocess.run(["mcopy", "-s", "-m", "-i", f"{path}@@{MIB}", str(esp / "EFI"), "::/"], check=True,
                   env={**env, "MTOOLS_SKIP_CHECK": "1"})
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", f"offset={9 * MIB}", "-d", str(root), str(path), "30M"],
                   check=True, env=env)
    return path


@pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS), reason="needs " + ", ".join(TOOLS))
def test_the_differing_file_inside_a_partition_is_named(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = disk(tmp_path / "a" / "disk.raw", tmp_path / "ta", "17:00:00\n")
    disk(tmp_path / "b" / "disk.raw", tmp_path / "tb", "17:00:09\n")
    entries = compare.entries_of(a)
    assert entries is not None and {"esp:/EFI/grub.cfg", "root:/etc/hostname", "root:/etc/build-time"} <= set(entries)
    lines = compare.compare_dirs(tmp_path / "a", tmp_path / "b", diffoscope=False)
    assert lines[0] == "disk.raw differs:"
    named = [line.strip() for line in lines if line.strip().startswith(("differs:", "only in"))]
    assert "differs: root:/etc/build-time" in named
    assert not [n for n in named if "hostname" in n or "grub.cfg" in n]
