"""The initramfs of a node image: generated once, after the last layer, and cached on exactly what
goes into it. The package phase diverts update-initramfs to a no-op (compose.phases), so no package
postinst or trigger generates one along the way.

Its key: the package phase (the kernel, its modules, firmware, initramfs-tools and its hooks, DKMS
modules all come from packages), the config-phase files under the paths initramfs-tools reads,
and every layer's config-phase script (a step may write anywhere). A service file leaves the key
alone, so the cached initramfs is linked in; a modprobe option changes it. A sysctl value or a kernel
argument does not even rebuild this step: they are written after it (compose.phases, boot configuration).

Generation runs update-initramfs in a throwaway container of the image (with the image's
SOURCE_DATE_EPOCH, so the archive is the same on every build) and keeps the result under
build/cache/initramfs/<key>/; the final engine step copies it in and undoes the diversion."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import docker

from ..compose.phases import DIVERT_TO, DIVERTED
from ..errors import BuildFailed
from ..fleetcache import cache as fleet
from ..paths import build_dir
from ..plan import CONFIG_FILES, BuildPlan, digest
from ..progress import Progress, Timer
from . import cancel
from .labels import ROLE_LABEL
from .steps import engine_build, step_ref

VERSION = 1
INPUT_PATHS = ("/etc/initramfs-tools/", "/usr/share/initramfs-tools/", "/etc/modprobe.d/", "/lib/modprobe.d/",
               "/usr/lib/modprobe.d/", "/lib/firmware/", "/usr/lib/firmware/", "/lib/modules/", "/usr/lib/modules/",
               "/etc/modules", "/etc/udev/", "/etc/fstab", "/etc/crypttab")

_UNDIVERT = (f"if dpkg-divert --list {DIVERTED} | grep -q nodeforge; then rm -f {DIVERTED}; "
             f"dpkg-divert --local --rename --divert {DIVERT_TO} --remove {DIVERTED}; fi")
_GENERATE = ("set -e; " + _UNDIVERT + "; found=; for m in /lib/modules/*; do v=${m##*/}; "
             "[ -e /boot/vmlinuz-$v ] || continue; found=1; rm -f /boot/initrd.img-$v; "
             "update-initramfs -c -k \"$v\" >&2; done; [ -n \"$found\" ] || { echo 'no kernel in /boot' >&2; exit 1; }")
_FINISH = ("set -e; " + _UNDIVERT + "; install -d /var/lib/initramfs-tools; for f in /boot/initrd.img-*; do "
           "v=${f#/boot/initrd.img-}; sha1sum \"$f\" > /var/lib/initramfs-tools/$v; "
           "linux-update-symlinks install \"$v\" /boot/vmlinuz-$v 2>/dev/null || true; done")


def own_inputs(plan: BuildPlan) -> dict[str, Any]:
    """What the image's own steps put into its initramfs: its package phase, the config-phase files
    under INPUT_PATHS and every config-phase script (a step may write anywhere)."""
    return {"packages": plan.install.key if plan.install else None,
            "files": sorted([f.path, f.mode, f.sha256] for s in plan.steps for f in s.files
                            if f.phase == CONFIG_FILES and f.path.startswith(INPUT_PATHS)),
            "scripts": [[s.layer, s.apply] for s in plan.steps if s.apply]}


class Parent(NamedTuple):
    """A child image's parent, as its initramfs key sees it."""

    key: str  # the parent's initramfs key
    epoch: int


def inputs_key(plan: BuildPlan, parent: Parent | None = None) -> str:
    """The initramfs's key: exactly its inputs. A child image (parent: its parent's) whose own steps
    add none (no package phase, no file under INPUT_PATHS, no script) and whose epoch is the
    parent's has the parent's key: it reuses the parent's initramfs instead of generating one."""
    own = own_inputs(plan)
    if plan.base.kind == "image" and parent is not None:
        if own == {"packages": None, "files": [], "scripts": []} and plan.base.epoch == parent.epoch:
            return parent.key
        return digest({"initramfs": VERSION, "parent": parent.key, "epoch": plan.base.epoch, **own})
    return digest({"initramfs": VERSION, "packages": own["packages"] or plan.base.key, "epoch": plan.base.epoch,
                   "files": own["files"], "scripts": own["scripts"]})


def _cache_dir(root: Path, key: str) -> Path:
    return build_dir(root) / "cache" / "initramfs" / key


def _generate(c: docker.DockerClient, content_ref: str, epoch: int, dest: Path) -> None:
    """update-initramfs in a throwaway container of the image; the initrd files into dest (atomically)."""
    container = c.containers.create(content_ref, ["/bin/sh", "-c", _GENERATE], entrypoint=[], user="root",
                                    environment={"SOURCE_DATE_EPOCH": str(epoch)}, network_mode="none",
                                    labels={ROLE_LABEL: "initramfs"})
    try:
        container.start()
        status = container.wait(timeout=1800)
        if status.get("StatusCode", 1) != 0:
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
            raise BuildFailed("generating the initramfs failed:\n" + "\n".join(err.splitlines()[-15:]))
        stream, _ = container.get_archive("/boot")
        data = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tarfile.open(fileobj=data) as tar:
            for m in tar.getmembers():
                name = Path(m.name).name
                if m.isfile() and name.startswith("initrd.img-") and "/" not in name:
                    src = tar.extractfile(m)
                    assert src is not None
                    with (tmp / name).open("wb") as out:
                        shutil.copyfileobj(src, out, 1 << 22)
        if not any(tmp.iterdir()):
            raise BuildFailed("generating the initramfs made no /boot/initrd.img-*")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link (the kept initramfs is never written to: generation replaces its directory)."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def step(c: docker.DockerClient, plan: BuildPlan, content_ref: str, root: Path, progress: Progress,
         log_dir: Path, parent: Parent | None = None, shared: fleet.SharedCache | None = None) -> tuple[str, str, str]:
    """The node image with its initramfs: (ref, content key of the result, what happened: cached (the
    whole step), pulled (the whole step, from the fleet cache), reused (the initramfs of the same
    inputs linked in), built, or inherited: a child image whose own steps put nothing into it has
    its parent's, already in the parent's layers, and no step of its own)."""
    ikey = inputs_key(plan, parent)
    if parent is not None and ikey == parent.key:  # nothing of the child's own goes into it: the parent's
        progress.say(plan.image, f"initramfs (after the last layer)  {'inherited':<8} {0.0:6.1f}s  {ikey[:12]} "
                     "(the parent image's, in its layers)")
        return content_ref, plan.layers_key, "inherited"
    final_key = digest({"content": plan.layers_key, "initramfs": ikey})
    tag = step_ref(final_key)
    cache = _cache_dir(root, ikey)
    with Timer() as t:
        status = fleet.have(c, shared, tag, "step", final_key, plan.image) or "reused"
        if status == "reused":
            if not cache.is_dir():
                progress.say(plan.image, f"initramfs generating ... (inputs {ikey[:12]} not built before)")
                _generate(c, content_ref, plan.base.epoch, cache)
                status = "built"
            # the context beside the cache, the kept files linked in, not copied (a copy where links fail)
            with tempfile.TemporaryDirectory(prefix=".ctx-", dir=cache.parent) as tmp, cancel.scratch(Path(tmp)):
                (Path(tmp) / "boot").mkdir()
                for f in cache.iterdir():
                    _link_or_copy(f, Path(tmp) / "boot" / f.name)
                dockerfile = (f"FROM {content_ref}\n# the initramfs, generated once after the last layer "
                              f"(inputs {ikey})\nCOPY boot/ /boot/\n"
                              f"RUN [\"/bin/sh\", \"-c\", {json.dumps(_FINISH)}]\n")
                engine_build(c, Path(tmp), dockerfile, tag, log_dir / "initramfs.log", network_mode="none")
            fleet.built(c, shared, tag, "step", final_key, plan.image)
    progress.say(plan.image, f"initramfs (after the last layer)  {status:<8} {t.seconds:6.1f}s  {ikey[:12]}")
    return tag, final_key, status
