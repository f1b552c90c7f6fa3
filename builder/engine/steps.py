"""Engine builds of single steps: a layer step or the initramfs step, each tagged by its content key."""

from __future__ import annotations

import tempfile
from pathlib import Path

import docker

from ..errors import BuildFailed
from ..paths import cache_repo
from ..plan import digest
from ..progress import Progress, Timer
from .client import image_exists

INITRAMFS_STEP = "RUN update-initramfs -u -k all\n"


def step_ref(key: str) -> str:
    return f"{cache_repo()}:{key}"


def engine_build(c: docker.DockerClient, context: Path, dockerfile: str, tag: str, log: Path,
                  buildargs: dict[str, str] | None = None) -> None:
    (context / "Dockerfile").write_text(dockerfile)
    log.parent.mkdir(parents=True, exist_ok=True)
    error = None
    with log.open("w") as f:
        f.write(dockerfile + "\n----\n")
        for chunk in c.api.build(path=str(context), tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                                 buildargs=buildargs or None):
            if "stream" in chunk:
                f.write(chunk["stream"])
            if "error" in chunk:
                error = chunk["error"]
                f.write(f"ERROR: {error}\n")
    if error:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise BuildFailed(f"engine build failed: {error.strip()}\n{tail}\n(full log: {log})")


def initramfs_step(c: docker.DockerClient, ref: str, key: str, progress: Progress, image: str,
                   log_dir: Path) -> tuple[str, str]:
    """Regenerate the initramfs after the last layer, so modprobe.d options and blacklists reach it.
    An engine step of its own, cached by the content key like every layer."""
    step_key = digest({"initramfs": key, "step": INITRAMFS_STEP})
    tag = step_ref(step_key)
    with Timer() as t:
        status = "cached"
        if not image_exists(c, tag):
            with tempfile.TemporaryDirectory(prefix="nodeforge-ctx-") as tmp:
                engine_build(c, Path(tmp), f"FROM {ref}\n{INITRAMFS_STEP}", tag, log_dir / "initramfs.log")
            status = "built"
    progress.say(image, f"initramfs (after the last layer)  {status:<8} {t.seconds:6.1f}s  {step_key[:12]}")
    return tag, step_key
