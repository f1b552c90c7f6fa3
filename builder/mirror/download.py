"""Downloads for a mirror, while the network is there: the .deb files of exact package versions
(apt-get download in a throwaway container of the image's base with its layers' repositories, so
apt checks each file against the signed archive's index), and wheels (checked against the lock)."""

from __future__ import annotations

import errno
import hashlib
import shlex
import ssl
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import docker

from .. import lockfile
from ..engine.labels import ROLE_LABEL
from ..engine.resolve import repo_files
from ..engine.trust import extra_ca
from ..errors import BuildFailed, UsageError
from ..plan import BuildPlan

_DIR = "/tmp/nodeforge-debs"
_MISSING = "@@nodeforge-missing "


def _script(wanted: list[str]) -> str:
    pkgs = " ".join(shlex.quote(p) for p in wanted)
    return "\n".join([
        "set -e", "export DEBIAN_FRONTEND=noninteractive", "apt-get update -q >&2",
        f"mkdir -p {_DIR}", f"cd {_DIR}", f"chown _apt {_DIR} 2>/dev/null || true",
        f"if ! apt-get download -q {pkgs} >&2; then",
        f"  for p in {pkgs}; do apt-cache show \"$p\" >/dev/null 2>&1 || echo \"{_MISSING}$p\"; done",
        "  exit 3", "fi", ""])


def debs(c: docker.DockerClient, base_ref: str, plans: list[BuildPlan], wanted: list[str], dest: Path,
         remedy: str) -> list[Path]:
    """name=version -> a .deb each, into dest; exit 2 naming the versions the archive no longer has."""
    container = c.containers.create(base_ref, ["bash", "-c", _script(wanted)], entrypoint=[], user="root",
                                    labels={ROLE_LABEL: "mirror"})
    try:
        for plan in plans:
            container.put_archive("/", repo_files(plan))
        container.start()
        status = container.wait(timeout=3600)
        if status.get("StatusCode", 1) != 0:
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            missing = [line[len(_MISSING):] for line in out.splitlines() if line.startswith(_MISSING)]
            if missing:
                raise UsageError(f"the package archive no longer has {', '.join(missing)}: {remedy}")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
            raise BuildFailed("downloading the locked packages failed:\n" + "\n".join(err.splitlines()[-15:]))
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=dest.parent) as buf:
            stream, _ = container.get_archive(_DIR)
            for chunk in stream:
                buf.write(chunk)
            buf.seek(0)
            with tarfile.open(fileobj=buf) as tar:
                found = []
                for m in tar.getmembers():
                    name = Path(m.name).name
                    if m.isfile() and name.endswith(".deb") and "/" not in name:
                        src = tar.extractfile(m)
                        assert src is not None
                        (dest / name).write_bytes(src.read())
                        found.append(dest / name)
    finally:
        container.remove(force=True)
    return sorted(found)


def wheel(url: str, sha256: str, dest: Path) -> Path:
    """One locked wheel into dest, checked against the lock's sha256."""
    name = lockfile.wheel_file(url)
    if not name.endswith(".whl") or name.startswith("."):
        raise UsageError(f"wheel URL {url!r} does not name a .whl file; run `nodeforge lock` again")
    dest.mkdir(parents=True, exist_ok=True)
    ca = extra_ca()
    context = ssl.create_default_context()
    if ca:
        context.load_verify_locations(cadata=ca)
    h = hashlib.sha256()
    tmp = dest / f".{name}.part"
    try:
        with urllib.request.urlopen(url, timeout=120, context=context) as r, tmp.open("wb") as f:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the destination is full, not the download broken:
            raise  # `mirror` names the destination and the space it needs
        raise BuildFailed(f"downloading {url} failed: {e}") from None
    if h.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise BuildFailed(f"{name}: sha256 {h.hexdigest()} differs from the lock's {sha256}")
    tmp.replace(dest / name)
    return dest / name
