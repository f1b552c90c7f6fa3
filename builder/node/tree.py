"""The image's file system as a directory to assemble from.

Where the engine keeps the image's layers in overlay2 directories on this machine (the local engine,
run as root), the layers are mounted read-only under an overlay whose upper directory takes the
assembly's own changes (the rootfs checks' fixes, signed modules): nothing is copied, and the
engine's directories are never written (an overlay writes only to its upper directory). This is
how the engine itself shows a container its root. Elsewhere (a remote engine, another storage
driver, no permission to mount) the file system is exported through the engine API and unpacked.
Both give the same tree: the same names, contents, owners, modes, times and extended attributes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..engine import cancel
from ..engine.labels import ROLE_LABEL
from ..errors import BuildFailed

MOUNT_OPTIONS_MAX = 3800  # the kernel takes a page of mount options
EXPORTED, MOUNTED = "exported", "mounted"


def layer_dirs(info: dict[str, Any]) -> list[str] | None:
    """The image's overlay2 layer directories, top first; None where they cannot be used here."""
    driver = info.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return None  # a remote engine: its directories are not this machine's
    dirs = [data["UpperDir"], *(d for d in (data.get("LowerDir") or "").split(":") if d)]
    if not all(os.path.isdir(d) and os.access(d, os.R_OK | os.X_OK) for d in dirs):
        return None
    return dirs


def _mountable(dirs: list[str], work: Path) -> bool:
    if os.geteuid() != 0:
        return False
    names = [*dirs, str(work)]
    return (not any("," in n or ":" in n or "\\" in n for n in names)
            and len(":".join(dirs)) + 3 * len(str(work)) < MOUNT_OPTIONS_MAX)


def _mount(dirs: list[str], work: Path, target: Path, prefix: str = "") -> bool:
    upper, scratch = work / f"{prefix}upper", work / f"{prefix}overlay-work"
    for d in (upper, scratch, target):
        d.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={':'.join(dirs)},upperdir={upper},workdir={scratch}"
    for extra in (",volatile", ""):  # volatile: no sync of the upper directory (it is thrown away)
        p = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options + extra, str(target)],
                           capture_output=True, text=True)
        if p.returncode == 0:
            return True
    return False


def _unmount(target: Path) -> None:
    cancel.unmount(target)


def export(c: docker.DockerClient, ref: str, dest: Path) -> None:
    """The file system through the engine API, unpacked with owners, modes and extended attributes."""
    dest.mkdir(parents=True)
    container = c.api.create_container(ref, command=["/bin/true"], labels={ROLE_LABEL: "export"})
    try:
        tar = subprocess.Popen(["tar", "-x", "-p", "--numeric-owner", "--xattrs", "--xattrs-include=*",
                                "-C", str(dest)], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert tar.stdin
        for chunk in c.api.export(container["Id"]):
            tar.stdin.write(chunk)
        tar.stdin.close()
        err = tar.stderr.read().decode() if tar.stderr else ""
        if tar.wait() != 0:
            raise BuildFailed(f"unpacking the image's file system failed: {err.strip()[-400:]}")
    finally:
        c.api.remove_container(container["Id"], force=True)


@contextlib.contextmanager
def image_tree(c: docker.DockerClient, ref: str, work: Path) -> Iterator[tuple[Path, str]]:
    """(the image's root as a directory under work, how it got there: mounted or exported). The
    directory may be changed (it is the assembly's own); a mount is undone on the way out.
    The image is held by a container while mounted, so that it cannot be removed meanwhile."""
    target = work / "rootfs"
    info = c.api.inspect_image(ref)
    dirs = layer_dirs(info)
    if dirs and _mountable(dirs, work):
        holder = c.api.create_container(info["Id"], command=["/bin/true"],
                                        labels={ROLE_LABEL: "assembly"})
        try:
            with cancel.scratch(target, "mount"):  # unmounted by the CLI if this thread is stopped in it
                if _mount(dirs, work, target):
                    try:
                        yield target, MOUNTED
                    finally:
                        _unmount(target)
                    return
            target.rmdir()
        finally:
            c.api.remove_container(holder["Id"], force=True)
    export(c, ref, target)
    yield target, EXPORTED


@dataclasses.dataclass(frozen=True)
class PackagePhase:
    """The package phase of a node image beside its final tree (node.root_fs makes the root ext4 of
    the one and writes the difference of the other into it)."""

    tree: Path  # the package phase's file system, mounted
    image_id: str  # its engine image id: a name for its exact content
    changes: list[Path]  # the overlay directories above it and the assembly's own changes to both trees


@contextlib.contextmanager
def package_phase(c: docker.DockerClient, final_ref: str, phase_ref: str, work: Path) -> Iterator[PackagePhase | None]:
    """The package phase's tree mounted beside the final tree that image_tree mounted under work;
    None where the final tree was not mounted or the phase's layers are not the final image's lowest."""
    try:
        phase_info = c.api.inspect_image(phase_ref)
    except docker.errors.ImageNotFound:
        yield None
        return
    below = layer_dirs(phase_info)
    full = layer_dirs(c.api.inspect_image(final_ref))
    target = work / "phase-rootfs"
    token = cancel.register(target, "mount")
    if (not below or not full or len(full) <= len(below) or full[-len(below):] != below
            or not (work / "upper").is_dir() or not _mountable(below, work)
            or not _mount(below, work, target, prefix="phase-")):
        cancel.unregister(token)
        yield None
        return
    try:
        # its own upper directory too: what the rootfs checks fix in it is read from the final tree
        changes = [work / "upper", work / "phase-upper", *(Path(d) for d in full[: len(full) - len(below)])]
        yield PackagePhase(target, phase_info["Id"], changes)
    finally:
        _unmount(target)
        cancel.unregister(token)
