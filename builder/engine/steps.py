"""Engine builds of single steps, each tagged by its content key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import docker

from ..errors import BuildFailed
from ..paths import cache_repo
from . import cancel


def step_ref(key: str) -> str:
    return f"{cache_repo()}:{key}"


def engine_build(c: docker.DockerClient, context: Path, dockerfile: str, tag: str, log: Path,
                  buildargs: dict[str, str] | None = None, on_line: Callable[[str], None] | None = None,
                  network_mode: str | None = None) -> None:
    """One engine build, its output into log (and each line to on_line: the live progress);
    network_mode "none": its RUN steps have no network."""
    (context / "Dockerfile").write_text(dockerfile)
    log.parent.mkdir(parents=True, exist_ok=True)
    error = None
    with log.open("w") as f:
        f.write(dockerfile + "\n----\n")
        for chunk in c.api.build(path=str(context), tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                                 buildargs=buildargs or None, network_mode=network_mode):
            cancel.check()
            if "stream" in chunk:
                f.write(chunk["stream"])
                if on_line and chunk["stream"].strip():
                    on_line(chunk["stream"].strip().splitlines()[-1])
            if "error" in chunk:
                error = chunk["error"]
                f.write(f"ERROR: {error}\n")
    if error:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise BuildFailed(f"engine build failed: {error.strip()}\n{tail}\n(full log: {log})")
