"""Container-scope checks: a test container of the image (testcontainers), removed at the end."""

from __future__ import annotations

import threading
from typing import Any

import docker

from ..engine import client as engine
from ..engine.client import SESSION_LABEL
from ..plan import Test
from .host import gpu_kwargs
from .result import judge_package, match_text, package_query


class TestContainer:
    """A running container of the image, its entrypoint replaced by a sleeper, removed at the end."""

    def __init__(self, ref: str, session: str) -> None:
        from testcontainers.core.container import DockerContainer

        self.dc = (DockerContainer(ref).with_command(["-c", "trap 'exit 0' TERM; sleep infinity & wait"])
                   .with_kwargs(entrypoint=["/bin/sh"], labels={SESSION_LABEL: session}, **gpu_kwargs()))
        self.dc.start()
        self.wrapped = self.dc.get_wrapped_container()
        self.ref = ref

    def exec(self, cmd: str, timeout: int, user: str | None = None) -> tuple[int, str, str, bool]:
        """(exit code, stdout, stderr, timed out)."""
        argv = ["timeout", "-k", "5", str(timeout), "/bin/bash", "-c", cmd]
        box: dict[str, Any] = {}

        def run() -> None:
            box["r"] = self.wrapped.exec_run(argv, demux=True, user=user or "")

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout + 15)
        if t.is_alive():
            return -1, "", "", True
        code, (out, err) = box["r"].exit_code, box["r"].output
        out_s = (out or b"").decode(errors="replace")
        err_s = (err or b"").decode(errors="replace")
        return code, out_s, err_s, code in (124, 137)

    def close(self) -> None:
        try:
            self.dc.stop()
        except Exception:
            pass


def check_command(box: TestContainer, spec: dict[str, Any]) -> tuple[str, str]:
    code, out, err, timed_out = box.exec(spec["run"], spec["timeout"], spec.get("user"))
    output = out + (("\n--- stderr\n" + err) if err else "")
    if timed_out:
        return f"timed out after {spec['timeout']}s", output
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}", output
    why = match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr")
    return why, output


def check_entrypoint(ref: str, spec: dict[str, Any], gpu: bool = False) -> tuple[str, str]:
    """Run the image as shipped: its own ENTRYPOINT, the test's args as the command, a fresh container."""
    c = engine.client()
    kwargs: dict[str, Any] = {}
    if gpu:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    container = c.containers.create(ref, command=list(spec.get("args") or []) or None,
                                    labels={SESSION_LABEL: "entrypoint"}, **kwargs)
    try:
        container.start()
        try:
            code = container.wait(timeout=spec["timeout"]).get("StatusCode", -1)
        except Exception:  # the engine's read timeout: the entrypoint did not finish
            return f"timed out after {spec['timeout']}s", ""
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    output = out + (("\n--- stderr\n" + err) if err else "")
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}", output
    return match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr"), output


def check_in_container(box: TestContainer, test: Test) -> tuple[str, str]:
    spec = test.spec
    if test.kind == "command":
        return check_command(box, spec)
    if test.kind == "entrypoint":
        return check_entrypoint(box.ref, spec, gpu="gpu" in test.requires)
    if test.kind == "package":
        code, out, _, _ = box.exec(package_query(spec["name"]), 30)
        return judge_package(spec, code, out), out
    if test.kind == "file":
        code, out, _, _ = box.exec(f"stat -c '%a %U %G %F' {spec['path']}", 30)
        if code != 0:
            return ("" if not spec.get("exists", True) else f"{spec['path']} does not exist"), out
        if not spec.get("exists", True):
            return f"{spec['path']} exists", out
        mode, owner, group, *_ = out.split()
        if spec.get("mode") and int(mode, 8) != int(spec["mode"], 8):
            return f"{spec['path']} has mode {mode}, expected {spec['mode']}", out
        if spec.get("owner") and owner != spec["owner"]:
            return f"{spec['path']} is owned by {owner}, expected {spec['owner']}", out
        if spec.get("group") and group != spec["group"]:
            return f"{spec['path']} has group {group}, expected {spec['group']}", out
        if spec.get("content"):
            _, text, _, _ = box.exec(f"cat {spec['path']}", 30)
            return match_text(spec["content"], text, spec["path"]), out
        return "", out
    return f"{test.kind} checks do not run in a container", ""
