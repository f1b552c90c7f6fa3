"""Stage 4: the base root filesystem with mmdebstrap, SOURCE_DATE_EPOCH fixed (bit-identical
tarballs), imported into the engine and cached by key: in the engine and as a tarball."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import docker

from ..errors import BuildFailed, EnvironmentProblem
from ..paths import base_repo
from ..plan import Base
from ..progress import Progress, Timer
from .client import image_exists

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# mmdebstrap copies the build host's resolv.conf and hostname in (for debootstrap's sake) and leaves
# them: the base layer would then differ from host to host. The engine mounts its own into every
# container; a node gets its name and resolvers from DHCP or the site.
DROP_HOST_FILES = 'rm -f "$1/etc/resolv.conf" "$1/etc/hostname"'


def cache_dir() -> Path:
    d = Path(os.environ.get("NODEFORGE_CACHE", Path.home() / ".cache" / "nodeforge"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def base_ref(base: Base) -> str:
    return f"{base_repo()}:{base.key}"


def mmdebstrap_command(base: Base, out: Path) -> list[str]:
    assert base.debian is not None
    deb = base.debian
    cmd = ["mmdebstrap", f"--variant={deb['variant']}", f"--components={','.join(deb['components'])}",
           "--aptopt=Acquire::Retries \"5\"", "--dpkgopt=force-unsafe-io", f"--customize-hook={DROP_HOST_FILES}"]
    if deb["include"]:
        cmd.append(f"--include={','.join(deb['include'])}")
    return [*cmd, deb["suite"], str(out), deb["mirror"]]


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


def ensure(c: docker.DockerClient, base: Base, progress: Progress, image: str, tar: Path | None = None) -> str:
    """The base in the engine: imported from its cached tarball (made first when missing) or, for an
    offline build, from tar (a mirror's copy)."""
    ref = base_ref(base)
    assert base.debian is not None
    what = f"debian {base.debian['suite']} {base.debian['variant']}"
    if image_exists(c, ref):
        progress.say(image, f"base {what:<28} cached")
        return ref
    status = "imported" if tar else "built"
    with Timer() as t:
        tar = tar or tarball(base, progress, image)
        c.api.import_image(src=str(tar), repository=base_repo(), tag=base.key,
                           changes=[f"ENV PATH={PATH}", 'CMD ["/bin/bash"]'])
    progress.say(image, f"base {what:<28} {status:<8} {t.seconds:6.1f}s")
    return ref
