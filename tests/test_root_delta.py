"""The root ext4 in two phases (node.root_fs, node.root_delta): the package tree's ext4 with the
changes above it written by debugfs holds exactly the final tree. The changes are made through a
real overlay mount, so its whiteouts, opaque directories and copied-up parents are the kernel's;
the result is read back with debugfs and checked with e2fsck. No engine."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.node import disk, root_delta, root_fs
from builder.node.artifacts import NodeArtifacts
from builder.node.tree import PackagePhase

EPOCH = 1735689600
SPECIAL = {"usr/local/bin/fifo", "usr/local/bin/null"}  # debugfs's rdump writes no fifos or devices
pytestmark = [
    pytest.mark.skipif(not all(shutil.which(t) for t in ("mkfs.ext4", "debugfs", "e2fsck", "sfdisk")),
                       reason="the disk tools are installed by make setup"),
    pytest.mark.skipif(os.geteuid() != 0, reason="an overlay mount needs root"),
]


def package_tree(root: Path) -> Path:
    for d in ("etc/ssl/certs", "usr/share/doc/pkg", "var/lib/gone/deep", "opt/becomes-file", "srv"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "hostname").write_text("build-host\n")
    (root / "etc" / "sysctl.conf").write_text("vm.swappiness = 60\n")
    (root / "etc" / "ssl" / "certs" / "old.pem").write_text("old\n")
    (root / "usr" / "share" / "doc" / "pkg" / "README").write_text("readme\n")
    (root / "var" / "lib" / "gone" / "deep" / "file").write_text("x\n")
    (root / "var" / "lib" / "gone" / "link").symlink_to("deep/file")
    (root / "opt" / "becomes-file" / "inner").write_text("y\n")
    (root / "srv" / "becomes-dir").write_text("z\n")
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "bin" / "tool").write_text("#!/bin/sh\n")
    os.link(root / "usr" / "bin" / "tool", root / "usr" / "bin" / "tool-alias")
    old = EPOCH - 86400
    for p in root.rglob("*"):
        os.utime(p, (old, old), follow_symlinks=False)
    return root


def change(merged: Path) -> None:
    """What config layers and the assembly's fixes do: through the overlay, as a build does."""
    (merged / "etc" / "hostname").unlink()
    (merged / "etc" / "sysctl.conf").write_text("vm.swappiness = 10\n")
    shutil.rmtree(merged / "etc" / "ssl" / "certs")
    (merged / "etc" / "ssl" / "certs").mkdir()  # recreated: opaque
    (merged / "etc" / "ssl" / "certs" / "new.pem").write_text("new\n")
    shutil.rmtree(merged / "var" / "lib" / "gone")
    shutil.rmtree(merged / "opt" / "becomes-file")
    (merged / "opt" / "becomes-file").write_text("now a file\n")
    (merged / "srv" / "becomes-dir").unlink()
    (merged / "srv" / "becomes-dir" / "nested").mkdir(parents=True)
    (merged / "srv" / "becomes-dir" / "nested" / "f").write_text("deep\n")
    (merged / "usr" / "share" / "doc" / "pkg" / "README").chmod(0o600)
    tool = merged / "usr" / "local" / "bin"
    tool.mkdir(parents=True)
    (tool / "gpu-check").write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    (tool / "gpu-check").chmod(0o4755)
    os.chown(tool / "gpu-check", 1234, 5678)
    os.link(tool / "gpu-check", tool / "gpu-check-alias")
    (tool / "with-xattr").write_text("x\n")
    os.setxattr(tool / "with-xattr", "user.nodeforge", b"value\0binary")
    (tool / "link").symlink_to("/usr/local/bin/gpu-check")
    os.mkfifo(tool / "fifo")
    os.mknod(tool / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.fixture
def layers(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(package tree, final merged tree, the overlay's upper directory)."""
    lower = package_tree(tmp_path / "lower")
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    p = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"no overlay mount here: {p.stderr.strip()}")
    try:
        change(merged)
        yield lower, merged, upper
    finally:
        subprocess.run(["umount", str(merged)], check=False)


def art(tmp_path: Path) -> NodeArtifacts:
    return NodeArtifacts("t", "k" * 64, "c" * 64, str(tmp_path), "6.1.0-0-amd64", "root=LABEL=r ro", "r",
                         root_fs.fs_uuid("p" * 64, 64, "r"), disk.ROOT_START_MIB + 64 + 1, 64)


def listing(tree: Path) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in (*dirnames, *filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, tree)
            if rel == "lost+found":
                continue
            st = os.lstat(p)
            content: object = None
            if stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            elif stat.S_ISCHR(st.st_mode):
                content = st.st_rdev
            mtime = min(int(st.st_mtime), EPOCH) if not stat.S_ISLNK(st.st_mode) else None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, content, mtime)
    return out


def read_back(image: str, into: Path) -> Path:
    into.mkdir()
    p = subprocess.run(["debugfs", "-R", f"rdump / {into}", image], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return into


def test_the_second_phase_writes_exactly_the_final_tree(tmp_path: Path, layers: tuple[Path, Path, Path]) -> None:
    lower, merged, upper = layers
    a = art(tmp_path)
    raw = tmp_path / "disk.raw"
    phase = PackagePhase(lower, "sha256:" + "e" * 64, [upper])
    how = root_fs.write(raw, a, merged, a.key, str(EPOCH), tmp_path / "project", phase)
    assert how.startswith("package phase made"), how
    image = f"{raw}?offset={disk.ROOT_START_MIB * disk.MIB}"
    fsck = subprocess.run(["e2fsck", "-fn", image], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    got = listing(read_back(image, tmp_path / "back"))
    want = {k: v for k, v in listing(merged).items() if k not in SPECIAL}
    assert got == want
    fifo = subprocess.run(["debugfs", "-R", "stat /usr/local/bin/fifo", image], capture_output=True, text=True)
    assert "Type: FIFO" in fifo.stdout, fifo.stdout
    null = subprocess.run(["debugfs", "-R", "stat /usr/local/bin/null", image], capture_output=True, text=True)
    assert "Type: character special" in null.stdout and "01:03" in null.stdout, null.stdout
    links = subprocess.run(["debugfs", "-R", "stat /usr/local/bin/gpu-check", image], capture_output=True,
                           text=True).stdout
    assert "Links: 2" in links, links  # one inode, two names, as in the tree
    ea = subprocess.run(["debugfs", "-R", "ea_get /usr/local/bin/with-xattr user.nodeforge", image],
                        capture_output=True, text=True).stdout
    assert "value" in ea, ea
    again = tmp_path / "again.raw"  # the first phase from the cache: the same bytes
    assert root_fs.write(again, a, merged, a.key, str(EPOCH), tmp_path / "project", phase).startswith(
        "package phase cached")
    assert hashlib.sha256(raw.read_bytes()).digest() == hashlib.sha256(again.read_bytes()).digest()


def test_a_change_debugfs_cannot_write_falls_back_to_one_phase(tmp_path: Path,
                                                                layers: tuple[Path, Path, Path]) -> None:
    lower, merged, upper = layers
    (merged / "etc" / 'a"quote').write_text("debugfs cannot quote this name\n")
    with pytest.raises(root_delta.Unsupported, match="cannot quote"):
        root_delta.commands(root_delta.View(merged), root_delta.View(lower),
                            root_delta.changed_names([upper]), EPOCH, tmp_path)
    a = art(tmp_path)
    raw = tmp_path / "disk.raw"
    how = root_fs.write(raw, a, merged, a.key, str(EPOCH), tmp_path / "project",
                        PackagePhase(lower, "sha256:" + "e" * 64, [upper]))
    assert how.startswith("in one phase: a name debugfs cannot quote"), how
    image = f"{raw}?offset={disk.ROOT_START_MIB * disk.MIB}"
    assert subprocess.run(["e2fsck", "-fn", image], capture_output=True).returncode == 0
    got = listing(read_back(image, tmp_path / "back"))
    assert got == {k: v for k, v in listing(merged).items() if k not in SPECIAL}
    assert 'etc/a"quote' in got


def test_a_name_seen_through_a_replaced_parent_is_not_followed(tmp_path: Path) -> None:
    """A parent that is a link in one tree is not a directory there: nothing is read through it."""
    final = tmp_path / "final"
    (final / "x").mkdir(parents=True)
    (final / "x" / "f").write_text("f\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "x").symlink_to("/etc")
    view = root_delta.View(pkg)
    assert view.lstat("x/f") is None and view.lstat("x/passwd") is None and not view.is_dir("x")
    cmds = root_delta.commands(root_delta.View(final), view, {"x", "x/f"}, EPOCH, tmp_path)
    assert cmds[:4] == ['cd "/"', 'rm "x"', 'mkdir "x"', 'cd "/x"']
