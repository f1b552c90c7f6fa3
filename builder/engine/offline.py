"""The package step of an offline build: the same step (same script, same key) run as a container
with the network off and a verified package mirror bind-mounted read-only, then committed (what a
RUN is: run and commit). apt reads the mirror through a configuration named by APT_CONFIG for this
run only, and the wheel lines copy the locked wheels from the mirror's wheel directory (each checked
against the lock's sha256, as online): the image's own sources stay as they are, and neither the
mirror nor the configuration is left in the image (a bind mount is not committed; the two small
files are removed)."""

from __future__ import annotations

import io
import shlex
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import docker

from ..compose.apply import WHEEL_MIRROR_VARIABLE
from ..errors import BuildFailed
from ..plan import LayerStep
from .client import inspect
from .dockerfile import APPLY_DIR, write_context
from .steps import step_ref

MOUNT = "/mnt"  # exists in every Debian root: the run creates no mount point that a commit would keep
WHEEL_DIR = "wheels"  # the mirror's directory of locked wheels (read by the package phase's wheel lines)
_CONF = "/tmp/nodeforge-offline-apt.conf"
_LIST = "/tmp/nodeforge-offline-apt.list"
# what the committed image keeps of the container's configuration: the parent's, as a RUN keeps it
_KEPT = ("Cmd", "Entrypoint", "Env", "WorkingDir", "User", "Labels", "ExposedPorts", "Volumes", "StopSignal",
         "OnBuild", "Shell")


def apt_options() -> list[str]:
    """apt configuration for the run: only the mirror, flat and trusted because every file of it
    was checked against the mirror's index before the build began."""
    return [f'Dir::Etc::SourceList "{_LIST}";', 'Dir::Etc::SourceParts "/dev/null";', 'Acquire::Languages "none";',
            'Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";']


def command(step: LayerStep, epoch: int) -> list[str]:
    source = f"deb [trusted=yes] file:{MOUNT} ./"
    script = [
        "set -e",
        f"printf '%s\\n' {' '.join(shlex.quote(o) for o in apt_options())} > {_CONF}",
        f"printf '%s\\n' {shlex.quote(source)} > {_LIST}",
        f"APT_CONFIG={_CONF} {WHEEL_MIRROR_VARIABLE}={MOUNT}/{WHEEL_DIR} SOURCE_DATE_EPOCH={epoch} "
        f"/bin/bash {APPLY_DIR}/{step.layer}.sh",
        f"rm -f {_CONF} {_LIST}",
    ]
    return ["/bin/sh", "-c", "\n".join(script)]


def _context_tar(step: LayerStep) -> bytes:
    """The step's files (its package-phase files and script) as COPY would put them: owned by root."""
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="nodeforge-ctx-") as tmp:
        write_context(step, Path(tmp))
        root = Path(tmp) / "root"
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path in sorted(p for p in root.rglob("*") if not p.is_dir()):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                with path.open("rb") as f:
                    tar.addfile(info, f if info.isfile() else None)
    return buf.getvalue()


def package_step(c: docker.DockerClient, step: LayerStep, parent_ref: str, epoch: int, mirror: Path,
                 log: Path) -> str:
    """Run the package step offline on parent_ref and commit it under the step's key; the tag."""
    parent: dict[str, Any] = inspect(c, parent_ref)["Config"] or {}
    kwargs: dict[str, Any] = {"entrypoint": []} if parent.get("Entrypoint") else {}
    container = c.containers.create(parent_ref, command(step, epoch), user="root", network_mode="none",
                                    volumes={str(mirror.resolve()): {"bind": MOUNT, "mode": "ro"}}, **kwargs)
    try:
        container.put_archive("/", _context_tar(step))
        container.start()
        status = container.wait(timeout=3600)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"offline package step {step.key} on {parent_ref}, mirror {mirror}\n----\n{output}")
        if status.get("StatusCode", 1) != 0:
            tail = "\n".join(output.splitlines()[-20:])
            raise BuildFailed(f"offline package step failed (exit {status.get('StatusCode')}):\n{tail}\n"
                              f"(full log: {log})")
        tag = step_ref(step.key)
        repo, _, key = tag.rpartition(":")
        conf = {k: parent[k] for k in _KEPT if parent.get(k) is not None}
        container.commit(repository=repo, tag=key, conf=conf)
    finally:
        container.remove(force=True)
    _check_config(c, tag, parent)
    return tag


def _check_config(c: docker.DockerClient, tag: str, parent: dict[str, Any]) -> None:
    """The committed step keeps its parent's command, entrypoint, environment and labels, as a RUN
    does (the container carries no label of its own: a commit would keep it)."""
    got = inspect(c, tag)["Config"] or {}
    for k in ("Cmd", "Entrypoint", "Env", "Labels"):
        if (got.get(k) or None) != (parent.get(k) or None):
            c.api.remove_image(tag, force=True)
            raise BuildFailed(f"offline package step: the committed image's {k} is {got.get(k)!r}, "
                              f"its parent's {parent.get(k)!r}")
