"""Container-scope checks: a test container of the image (testcontainers), removed at the end."""

from __future__ import annotations

import threading
from typing import Any

import docker

from ..engine import client as engine
from ..engine.client import SESSION_LABEL
from ..plan import Test
from .host import gpu_kwargs
from .judges import PROBE_JUDGES, command_output
from .result import match_text


class TestContainer:
    """A running container of the image, its entrypoint replaced by a sleeper, removed at the end."""

    def __init__(self, ref: str, session: str) -> None:
        from testcontainers.core.container import DockerContainer

        self.dc = (DockerContainer(ref).with_command(["-c", "trap 'exit 0' TERM; sleep infinity & wait"])
                   .with_kwargs(entrypoint=["/bin/sh"], labels={SESSION_LABEL: session, **engine.owner_labels()},
                                **gpu_kwargs()))
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
    output = command_output(out, err)
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}", output
    return match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr"), output


def check_in_container(box: TestContainer, test: Test) -> tuple[str, str]:
    """Run the kind's probe in the test container and hand its output to the kind's judge (the same
    probe and judge as in a booted node)."""
    spec = test.spec
    if test.kind == "entrypoint":
        return check_entrypoint(box.ref, spec, gpu="gpu" in test.requires)
    judge = PROBE_JUDGES.get(test.kind)
    if judge is None:
        return f"{test.kind} checks do not run in a container", ""
    timeout = int(spec.get("timeout") or 60)
    code, out, err, timed_out = box.exec(judge.probe(spec), timeout, spec.get("user"))
    if timed_out:
        return f"timed out after {timeout}s", command_output(out, err)
    return judge.judge(spec, (code, out, err)), command_output(out, err)
