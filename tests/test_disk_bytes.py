"""The disk's bytes depend on the tree and the definitions only: not on when the tree was unpacked
(mkfs.ext4 -d copies atime and ctime), not on the build's clock (GRUB, the ESP). Real tools on
a small tree; no engine."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from builder.node import disk
from builder.node.artifacts import NodeArtifacts

EPOCH = 1735689600
pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("mkfs.ext4", "debugfs", "sfdisk", "grub-mkimage", "mkfs.vfat", "mcopy")),
    reason="the disk tools are installed by make setup")


def tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname.d").mkdir()
    (root / "etc" / "dev-disk-by\\x2did.device.wants").mkdir()  # systemd's escaping, as the kernel layer has
    (root / "etc" / "fstab").write_text("LABEL=r / ext4 defaults 0 1\n")
    (root / "etc" / "built-at").write_text("a file a build step wrote (its mtime is the build's clock)\n")
    os.symlink("fstab", root / "etc" / "fstab.link")
    old = EPOCH - 86400
    for p in (root / "etc" / "fstab", root / "etc" / "hostname.d"):
        os.utime(p, (old, old))
    return root


def make_disk(work: Path, rootfs: Path) -> bytes:
    work.mkdir(parents=True, exist_ok=True)
    art = NodeArtifacts("t", "k" * 64, "c" * 64, str(work), "6.1.0-0-amd64", "root=LABEL=r ro", "r",
                        "0b1e9a35-8c55-4a8e-9a43-f3a39e4c1c3c", disk.ROOT_START_MIB + 32 + 1, 32)
    (work / "grub.cfg").write_text(disk.grub_config(art, "t", "0.1"))
    raw = work / "disk.raw"
    disk.root_disk(raw, art, rootfs, art.key, str(EPOCH))
    disk.boot_loaders(raw, work, art.key, str(EPOCH))
    return raw.read_bytes()


def test_two_assemblies_of_the_same_tree_at_different_times_are_identical(tmp_path: Path) -> None:
    rootfs = tree(tmp_path / "rootfs")
    first = make_disk(tmp_path / "a", rootfs)
    time.sleep(1.1)
    for p in rootfs.rglob("*"):  # what unpacking the tree again does: new atime and ctime
        if not p.is_symlink():
            os.chmod(p, os.stat(p).st_mode)
            p.stat()
    second = make_disk(tmp_path / "b", rootfs)
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()


def test_times_in_the_root_file_system_are_clamped_to_the_epoch(tmp_path: Path) -> None:
    rootfs = tree(tmp_path / "rootfs")
    make_disk(tmp_path / "a", rootfs)
    image = f"{tmp_path / 'a' / 'disk.raw'}?offset={disk.ROOT_START_MIB * disk.MIB}"

    def stat(path: str) -> str:
        return subprocess.run(["debugfs", "-R", f"stat {path}", image], capture_output=True, text=True).stdout

    written = stat("/etc/built-at")  # newer than the epoch: clamped
    assert f"0x{EPOCH:x}" in written and written.count(f"0x{EPOCH:x}") >= 3, written
    older = stat("/etc/fstab")  # older: kept, and atime and ctime follow it
    assert older.count(f"0x{EPOCH - 86400:x}") >= 3, older
    assert f"0x{EPOCH:x}" in stat("/etc/fstab.link")  # a link's own inode


def test_time_commands_skip_names_debugfs_cannot_quote(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / 'a"b').write_text("x")
    (root / "plain").write_text("x")
    (root / "dev-disk-by\\x2did.device.wants").mkdir()  # systemd's escaping: a backslash debugfs takes as it is
    (root / 'q"d').mkdir()
    (root / 'q"d' / "inside").write_text("x")  # under a directory debugfs cannot cd into: skipped too
    cmds = disk.time_commands(root, EPOCH)
    assert 'cd "/"' in cmds and any(c.startswith('sif "plain" ') for c in cmds)
    assert not any('a"b' in c or "inside" in c or 'q"d' in c for c in cmds)
    assert 'cd "/dev-disk-by\\x2did.device.wants"' in cmds
    assert sum(c.startswith('sif "/" ') for c in cmds) == 3
