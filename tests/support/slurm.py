"""A one-node Slurm cluster of Debian's own daemons in a directory: munged with a fresh key, slurmctld
and slurmd on free ports, no cgroups, no accounting. `cluster(dir)` yields the environment that
points sbatch, squeue and scontrol at it (SLURM_CONF), and stops the daemons at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=nodeforge-test", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", "AuthType=auth/munge",
        f"AuthInfo=socket={d}/munge.sock", "CredType=cred/munge", f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool", f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "ReturnToService=2", "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MinJobAge=3600",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=build Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


def _stop(pidfile: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)


@contextlib.contextmanager
def cluster(d: Path) -> Iterator[dict[str, str]]:
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (d / "slurm.conf").write_text(_conf(d, host))
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    try:
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={d}/munge.sock",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                       check=True, env=env)
        subprocess.run(["slurmctld", "-f", str(d / "slurm.conf")], check=True, env=env)
        subprocess.run(["slurmd", "-f", str(d / "slurm.conf")], check=True, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env)
            if p.returncode == 0 and p.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the test cluster did not come up: {(d / 'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=env)
        for name in ("slurmd", "slurmctld", "munged"):
            _stop(d / f"{name}.pid")


def job(env: dict[str, str], job_id: str) -> dict[str, str]:
    """scontrol's fields of a job (JobState, Dependency, StartTime, EndTime, ExitCode, ...)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, env=env,
                         check=True).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def wait(env: dict[str, str], job_ids: list[str], timeout: float = 900) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        states = {j: job(env, j) for j in job_ids}
        if all(s["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") for s in states.values()):
            return states
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs not finished: {states}")
        time.sleep(1)
