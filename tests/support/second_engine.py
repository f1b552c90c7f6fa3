"""A second Docker Engine on this machine: its own dockerd with its own data root, exec root,
socket and bridge (no NAT: its containers reach nothing outside; never
`--bridge none`, with which dockerd deletes the default docker0 that the first engine uses), empty when it starts and
removed when the block ends. A fleet-cache test's "other build machine".

    with second_engine(tmp) as docker_host:    # "unix:///.../docker.sock"
        subprocess.run([... "build" ...], env={**os.environ, "DOCKER_HOST": docker_host})"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BRIDGE_PREFIX = "nfb"


def _bridge(name: str, subnet: int) -> bool:
    """A bridge of its own for the second engine; False where this machine cannot make one."""
    steps = [["ip", "link", "add", name, "type", "bridge"],
             ["ip", "addr", "add", f"172.29.{subnet}.1/24", "dev", name],
             ["ip", "link", "set", name, "up"]]
    for step in steps:
        if subprocess.run(step, capture_output=True).returncode != 0:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            return False
    return True


@contextmanager
def second_engine(tmp: Path) -> Iterator[str]:
    data = tmp / "engine-data"
    run = Path(tempfile.mkdtemp(prefix="nf-eng-", dir="/run"))  # short: containerd's socket path is limited
    sock = run / "docker.sock"
    name = f"{BRIDGE_PREFIX}{os.getpid() % 10000}"
    if not _bridge(name, os.getpid() % 200 + 20):  # never --bridge none: that engine removes docker0, A's bridge
        raise RuntimeError(f"cannot make the bridge {name} for the second engine (ip link add ... type bridge)")
    bridge = ["--bridge", name]
    log = (tmp / "dockerd.log").open("w")
    proc = subprocess.Popen(["dockerd", "--data-root", str(data), "--exec-root", str(run / "exec"),
                             "--pidfile", str(run / "dockerd.pid"), "-H", f"unix://{sock}", *bridge,
                             "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
                            stdout=log, stderr=subprocess.STDOUT)
    host = f"unix://{sock}"
    try:
        for _ in range(150):
            if proc.poll() is not None:
                raise RuntimeError(f"the second dockerd exited: {(tmp / 'dockerd.log').read_text()[-2000:]}")
            if subprocess.run(["docker", "-H", host, "info"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the second dockerd did not answer in 30 s")
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for mount in sorted((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                             if line.split()[1].startswith((str(data), str(run)))), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
