"""Stage 4: the base root filesystem with mmdebstrap, SOURCE_DATE_EPOCH fixed (bit-identical
tarballs), imported into the engine and cached by key: in the engine and as a tarball."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker

from .. import debian
from ..errors import BuildFailed, EnvironmentProblem, UsageError
from ..fleetcache import cache as fleet
from ..paths import base_repo
from ..plan import Base
from ..progress import Progress, Timer

PATH = debian.PATH
CHANGES = list(debian.IMPORT_CHANGES)
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def cache_dir() -> Path:
    d = Path(os.environ.get("NODEFORGE_CACHE", Path.home() / ".cache" / "nodeforge"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def base_ref(base: Base) -> str:
    return f"{base_repo()}:{base.key}"


def mmdebstrap_command(base: Base, out: Path) -> list[str]:
    assert base.debian is not None
    return debian.mmdebstrap_command(base.debian, str(out))


def recreate_script(base: Base) -> str:
    """A shell script that recreates the base (bit-identical with the same SOURCE_DATE_EPOCH) and imports
    it as the engine does: `render` writes it next to the Dockerfile."""
    changes = " ".join(f"--change {shlex.quote(c)}" for c in debian.IMPORT_CHANGES)
    return ("#!/bin/sh\n# Recreates this image's base (bit-identical with the same SOURCE_DATE_EPOCH)\nset -e\n"
            f"SOURCE_DATE_EPOCH={base.epoch} {shlex.join(mmdebstrap_command(base, Path('base.tar')))}\n"
            f"docker import {changes} base.tar {shlex.quote(base_ref(base))}\n")


def tarball(base: Base, progress: Progress, image: str) -> Path:
    target = cache_dir() / "bases" / f"{base.key}.tar"
    if target.is_file():
        return target
    if shutil.which("mmdebstrap") is None:
        raise EnvironmentProblem("mmdebstrap is not installed; run `make setup`")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp.tar")
    cmd = mmdebstrap_command(base, tmp)
    progress.say(image, f"base: {' '.join(cmd[:-2])} ... (SOURCE_DATE_EPOCH={base.epoch})")
    progress.stage(image, "base: mmdebstrap")
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(base.epoch)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        raise BuildFailed(f"mmdebstrap failed (exit {proc.returncode}):\n{tail}")
    os.replace(tmp, target)
    return target


def ensure(c: docker.DockerClient, base: Base, progress: Progress, image: str, tar: Path | None = None,
           sha256: str | None = None, shared: fleet.SharedCache | None = None) -> str:
    """The base in the engine: imported from its cached tarball (made first when missing), pulled
    from the fleet cache (shared) or, for an offline build, from tar (a mirror's copy), whose bytes
    must have `sha256` (the digest the mirror's checked index gives that file): see import_checked."""
    ref = base_ref(base)
    assert base.debian is not None
    what = f"debian {base.debian['suite']} {base.debian['variant']}"
    with Timer() as t:
        found = fleet.have(c, shared, ref, "base", base.key, image)
    if found:
        progress.say(image, f"base {what:<28} {found:<8} {t.seconds:6.1f}s" if found == "pulled"
                     else f"base {what:<28} cached")
        return ref
    status = "imported" if tar else "built"
    with Timer() as t:
        if tar is None:
            c.api.import_image(src=str(tarball(base, progress, image)), repository=base_repo(), tag=base.key,
                               changes=CHANGES)
        else:
            import_checked(c, base, tar, sha256)
    progress.say(image, f"base {what:<28} {status:<8} {t.seconds:6.1f}s")
    fleet.built(c, shared, ref, "base", base.key, image)
    return ref


def _open_tar(tar: Path, remedy: str) -> int:
    """A descriptor of the regular file tar, not through a final symbolic link and never blocking
    (a FIFO is refused, not waited on)."""
    try:
        fd = os.open(tar, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
    except OSError as e:
        raise UsageError(f"base tarball {tar}: cannot be opened ({e.strerror}); {remedy}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"base tarball {tar}: not a regular file; {remedy}")
    return fd


def _imported_id(output: str) -> str:
    """The image id in the engine's answer to an import (a JSON message per line, the last
    {"status": "sha256:..."}); BuildFailed for an error message or no id."""
    found = ""
    for line in output.splitlines():
        try:
            msg = json.loads(line) if line.strip() else {}
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("error"):
            raise BuildFailed(f"the engine refused the base tarball: {msg['error']}")
        status = msg.get("status") if isinstance(msg, dict) else None
        if isinstance(status, str) and IMAGE_ID.fullmatch(status):
            found = status
    if not found:
        raise BuildFailed(f"importing the base gave no image id: {output[-500:]!r}")
    return found


def import_checked(c: docker.DockerClient, base: Base, tar: Path, sha256: str | None) -> None:
    """Import tar into the engine and tag it as base.key (the key this build computed, never one a
    mirror names) only once the very bytes the engine read have `sha256`: the file is read once,
    hashed as it streams, imported untagged, and removed again when the digest differs. A file
    changed after the mirror's check, swapped for a link, or a FIFO is never cached as the base."""
    remedy = "make the mirror again with `nodeforge mirror IMAGE... DIR` where the network is and carry it over whole"
    if not sha256:
        raise BuildFailed(f"base {base.key[:12]}: {tar} comes with no sha256 to check it against; an offline "
                          "base is imported only once checked against its mirror's index")
    h = hashlib.sha256()
    fd = _open_tar(tar, remedy)
    with os.fdopen(fd, "rb") as f:
        def chunks() -> Iterator[bytes]:
            while chunk := f.read(1 << 22):
                h.update(chunk)
                yield chunk

        image_id = _imported_id(c.api.import_image(src=chunks(), changes=CHANGES, stream_src=True))
        whole = f.read(1) == b""
    if not whole or h.hexdigest() != sha256:
        c.api.remove_image(image_id, force=True)
        got = h.hexdigest() if whole else "of a part only (the engine stopped reading)"
        raise UsageError(f"base {base.key[:12]}: {tar} has sha256 {got}, the mirror's index says {sha256}: it "
                         f"changed after the mirror was checked, so it was not imported; {remedy}")
    c.api.tag(image_id, base_repo(), base.key)
