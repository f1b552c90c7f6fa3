"""The root ext4 of a node disk, in two phases as the image is built: the package phase's file
system (made once with mkfs.ext4 -d and cached by the engine id of the package phase and the
layout), then the changes above it (node.root_delta) written into a copy of it with debugfs. A
value edit then costs a copy inside the kernel and a few debugfs commands instead of a new file
system of the whole tree. Both phases are functions of their inputs, so two builds of the same
definitions write the same bytes, whether the first phase came from the cache or not.

The root file system's UUID and hash seed come from the package phase's step key and the layout
(not from the whole image's key): the cached first phase carries them."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ..paths import build_dir
from . import root_delta
from .artifacts import NodeArtifacts
from .disk import MIB, ROOT_START_MIB, _uuid, copy_sparse, make_root_fs, partition
from .tree import PackagePhase

ROOT_FS_VERSION = 2  # 2: the package phase cleaned by the rootfs checks first


def fs_uuid(seed: str, root_mib: int, label: str) -> str:
    """The root file system's UUID (and hash seed): seed is the package phase's key where there is one."""
    return _uuid(f"{seed}:{root_mib}:{label}", "root-fs")


@functools.cache
def e2fsprogs_version() -> str:
    """mke2fs's version line, and where dpkg knows them the exact package versions of e2fsprogs and
    the library it writes with (a Debian revision leaves the version line as it was)."""
    p = subprocess.run(["mke2fs", "-V"], capture_output=True, text=True)
    line = (p.stderr or p.stdout).splitlines()[0] if (p.stderr or p.stdout) else "unknown"
    try:
        q = subprocess.run(["dpkg-query", "-W", "-f", "${Package}=${Version} ", "e2fsprogs", "libext2fs2"],
                           capture_output=True, text=True)
    except OSError:
        return line
    return f"{line} {q.stdout.strip()}" if q.returncode == 0 else line


def cache_path(root: Path, art: NodeArtifacts, phase: PackagePhase, epoch: str) -> Path:
    inputs = f"{ROOT_FS_VERSION}:{phase.image_id}:{art.root_mib}:{art.root_label}:{art.root_uuid}:{epoch}:" \
             f"{e2fsprogs_version()}"
    return build_dir(root) / "cache" / "root-fs" / art.image / f"{hashlib.sha256(inputs.encode()).hexdigest()}.ext4"


def _first_phase(path: Path, art: NodeArtifacts, phase: PackagePhase, epoch: str) -> bool:
    """The package phase's ext4 at path, made unless cached (the image's older ones removed); made?"""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".ext4", dir=path.parent)
    os.close(fd)
    try:
        make_root_fs(Path(tmp), art, phase.tree, epoch)
        for old in path.parent.glob("[!.]*.ext4"):  # not the temporary ones (names with a leading dot)
            old.unlink()
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return True


def write(disk: Path, art: NodeArtifacts, rootfs: Path, key: str, epoch: str, root: Path,
          phase: PackagePhase | None) -> str:
    """The GPT and the root ext4 in `disk`; returns how the root file system was made."""
    partition(disk, art, key)
    offset = ROOT_START_MIB * MIB
    if phase is not None:
        cached = cache_path(root, art, phase, epoch)
        try:
            with tempfile.TemporaryDirectory(prefix=".delta-", dir=disk.parent) as scratch:
                script, freed = root_delta.delta(root_delta.View(rootfs), root_delta.View(phase.tree),
                                                 root_delta.changed_names(phase.changes), int(epoch), Path(scratch))
                made = _first_phase(cached, art, phase, epoch)
                copy_sparse(cached, disk, offset)
                zeroed = root_delta.zero_freed(disk, offset, freed, Path(scratch) / "blocks")
                root_delta.run(f"{disk}?offset={offset}", script, int(epoch), Path(scratch) / "delta")
            return (f"package phase {'made' if made else 'cached'}, {len(script)} debugfs commands on top, "
                    f"{zeroed // 1024} KiB of removed files zeroed")
        except root_delta.Unsupported as e:
            disk.unlink()
            partition(disk, art, key)
            why = f"in one phase: {e}"
    else:
        why = "in one phase"
    make_root_fs(disk, art, rootfs, epoch, offset)
    return why
