"""The package step run as a container and committed (what a RUN is: run and commit), the same
step (same script, same key) as the Dockerfile's:

- offline: with the network off and a verified package mirror bind-mounted read-only;
- online, when the step downloads wheels: with the network, and the build host's extra CAs
  (engine.trust) put into the container as a file that the command reads into the wheel lines'
  NODEFORGE_CA_BUNDLE and removes before the step's script runs. No build argument carries them
  (the legacy builder writes those into the image's history): the committed image's history holds
  the command, never the bundle, and no layer holds the file. The command is the same with and
  without extra CAs, so the image is too.

Offline, apt reads the mirror through a configuration named by APT_CONFIG for this
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
from . import cancel
from .client import inspect
from .dockerfile import APPLY_DIR, write_context
from .steps import step_ref
from .trust import extra_ca

MOUNT = "/mnt"  # exists in every Debian root: the run creates no mount point that a commit would keep
WHEEL_DIR = "wheels"  # the mirror's directory of locked wheels (read by the package phase's wheel lines)
_CONF = "/tmp/nodeforge-offline-apt.conf"
_LIST = "/tmp/nodeforge-offline-apt.list"
CA_FILE = "tmp/nodeforge-ca.pem"  # online: the extra CAs, read and removed by the command before the script
# what the committed image keeps of the container's configuration: the parent's, as a RUN keeps it
_KEPT = ("Cmd", "Entrypoint", "Env", "WorkingDir", "User", "Labels", "ExposedPorts", "Volumes", "StopSignal",
         "OnBuild", "Shell")


def apt_options() -> list[str]:
    """apt configuration for the run: only the mirror, flat and trusted because every file of it
    was checked against the mirror's index before the build began."""
    return [f'Dir::Etc::SourceList "{_LIST}";', 'Dir::Etc::SourceParts "/dev/null";', 'Acquire::Languages "none";',
            'Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";']


def online_command(step: LayerStep, epoch: int) -> list[str]:
    """The online package step's command: the extra CAs (if given) into a shell variable, their file
    removed, then the step's script; nothing of the bundle is in the command itself."""
    script = [
        "set -e",
        'ca=""',
        f"if [ -f /{CA_FILE} ]; then ca=$(cat /{CA_FILE}); rm -f /{CA_FILE}; fi",
        f'NODEFORGE_CA_BUNDLE="$ca" SOURCE_DATE_EPOCH={epoch} /bin/bash {APPLY_DIR}/{step.layer}.sh',
    ]
    return ["/bin/sh", "-c", "\n".join(script)]


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


def _context_tar(step: LayerStep, ca: str = "") -> bytes:
    """The step's files (its package-phase files and script) as COPY would put them: owned by root;
    and the extra CAs as CA_FILE (mode 0600), which the command removes before the script runs."""
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="nodeforge-ctx-") as tmp, cancel.scratch(Path(tmp)):
        write_context(step, Path(tmp))
        root = Path(tmp) / "root"
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path in sorted(p for p in root.rglob("*") if not p.is_dir()):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                with path.open("rb") as f:
                    tar.addfile(info, f if info.isfile() else None)
            if ca:
                data = ca.encode()
                info = tarfile.TarInfo(CA_FILE)
                info.size, info.mode = len(data), 0o600
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def package_step(c: docker.DockerClient, step: LayerStep, parent_ref: str, epoch: int, mirror: Path | None,
                 log: Path) -> str:
    """Run the package step on parent_ref (offline from mirror, or online with the extra CAs) and
    commit it under the step's key; the tag."""
    parent: dict[str, Any] = inspect(c, parent_ref)["Config"] or {}
    kwargs: dict[str, Any] = {"entrypoint": []} if parent.get("Entrypoint") else {}
    if mirror is not None:
        kwargs.update(network_mode="none", volumes={str(mirror.resolve()): {"bind": MOUNT, "mode": "ro"}})
    ca = extra_ca() if mirror is None and step.wheels else ""
    cmd = command(step, epoch) if mirror is not None else online_command(step, epoch)
    container = c.containers.create(parent_ref, cmd, user="root", **kwargs)
    try:
        container.put_archive("/", _context_tar(step, ca))
        container.start()
        status = container.wait(timeout=3600)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        log.parent.mkdir(parents=True, exist_ok=True)
        what = "offline package step" if mirror is not None else "package step"
        log.write_text(f"{what} {step.key} on {parent_ref}" + (f", mirror {mirror}" if mirror else "")
                       + f"\n----\n{output}")
        if status.get("StatusCode", 1) != 0:
            tail = "\n".join(output.splitlines()[-20:])
            raise BuildFailed(f"{what} failed (exit {status.get('StatusCode')}):\n{tail}\n"
                              f"(full log: {log})")
        tag = step_ref(step.key)
        repo, _, key = tag.rpartition(":")
        conf = {k: parent[k] for k in _KEPT if parent.get(k) is not None}
        container.commit(repository=repo, tag=key, conf=conf)
    finally:
        container.remove(force=True)
    _check_config(c, tag, parent)
    return tag


def source_step(c: docker.DockerClient, step: LayerStep, parent_ref: str, epoch: int, offline: bool,
                log: Path) -> str:
    """A config step that reads build-host directories (compose.host_sources): its files and script
    put in as COPY would, the script run as the Dockerfile's RUN runs it, each directory bind-mounted
    read-only where the script expects it (a bind mount is not committed), then committed under the
    step's key with its ENV and ENTRYPOINT; offline: with the network off, as every offline step."""
    parent: dict[str, Any] = inspect(c, parent_ref)["Config"] or {}
    kwargs: dict[str, Any] = {"entrypoint": []} if parent.get("Entrypoint") else {}
    kwargs["volumes"] = {h.path: {"bind": h.mount, "mode": "ro"} for h in step.host_sources}
    if offline:
        kwargs["network_mode"] = "none"
    cmd = (["/usr/bin/env", f"SOURCE_DATE_EPOCH={epoch}", "/bin/bash", f"{APPLY_DIR}/{step.layer}.sh"]
           if step.apply else ["/bin/true"])
    container = c.containers.create(parent_ref, cmd, user="root", **kwargs)
    try:
        container.put_archive("/", _context_tar(step))
        container.start()
        status = container.wait(timeout=3600)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
        log.parent.mkdir(parents=True, exist_ok=True)
        sources = ", ".join(f"{h.param} at {h.mount}" for h in step.host_sources)
        log.write_text(f"layer {step.layer} {step.key} on {parent_ref}, build-host sources: {sources}\n----\n{output}")
        if status.get("StatusCode", 1) != 0:
            tail = "\n".join(output.splitlines()[-20:])
            raise BuildFailed(f"layer {step.layer} failed (exit {status.get('StatusCode')}):\n{tail}\n"
                              f"(full log: {log})")
        tag = step_ref(step.key)
        repo, _, key = tag.rpartition(":")
        conf = {k: parent[k] for k in _KEPT if parent.get(k) is not None}
        expected = dict(parent)
        if step.env:
            names = {k for k, _ in step.env}
            env = [e for e in parent.get("Env") or [] if e.partition("=")[0] not in names]
            conf["Env"] = expected["Env"] = env + [f"{k}={v}" for k, v in step.env]
        if step.entrypoint is not None:
            conf["Entrypoint"] = expected["Entrypoint"] = list(step.entrypoint)
            conf["Cmd"] = expected["Cmd"] = None  # ENTRYPOINT resets CMD
        container.commit(repository=repo, tag=key, conf=conf)
    finally:
        container.remove(force=True)
    _check_config(c, tag, expected)
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
