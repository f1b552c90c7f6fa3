"""Fan-out of a matrix's variants as Slurm jobs (`nodeforge matrix ... --submit slurm`): one batch job
per variant, each running `nodeforge build` for it from the project's directory, submitted so that
every step key two variants share is built once.

The rule, stated: the first variant (in the matrix's order) that builds a shared key is its leader;
every other variant that builds the key waits for its leader to finish well
(`--dependency=afterok:LEADER`), then finds the key built and takes it as cached. Variants that share
nothing start at once, side by side. Leaders always come earlier in the order, so the dependencies
have no cycle. Finding a key built needs the engine the leader built into: the jobs run where that
engine is (one build node, or DOCKER_HOST naming an engine the build nodes share, which the jobs
inherit from the submitting shell); across build nodes with engines of their own it needs the
shared registry cache (not yet: the jobs then still run in order, each building what it lacks).

Scripts and job output go to build/matrix/<id>/; values reach a script only as quoted words."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .compose.variants import Variant
from .errors import EnvironmentProblem, UsageError
from .paths import build_dir
from .plan import digest


def dependencies(found: list[Variant]) -> list[list[int]]:
    """For each variant, the indexes of the leaders it waits for (each earlier than itself)."""
    leader: dict[str, int] = {}
    out: list[list[int]] = []
    for i, v in enumerate(found):
        waits = set()
        for s in v.steps:
            first = leader.setdefault(s.key, i)
            if first != i:
                waits.add(first)
        out.append(sorted(waits))
    return out


def script(v: Variant, root: Path, python: str = sys.executable) -> str:
    words = shlex.split(v.plan.build_command)  # nodeforge build images/X.yaml [-c C] [--set S]...
    command = [python, "-m", "builder", *words[1:]]
    return "\n".join(["#!/bin/bash", f"# nodeforge matrix: variant {v.name}, plan key {v.plan.key}",
                      "set -euo pipefail", f"cd {shlex.quote(str(root))}", f"exec {shlex.join(command)}", ""])


def _job_name(v: Variant) -> str:
    return "nodeforge-" + "".join(c if c.isalnum() or c in "-_.@" else "_" for c in v.name)


def submit(found: list[Variant], root: Path, sbatch_args: list[str]) -> list[dict[str, Any]]:
    """Write each variant's script and submit it; the jobs as {variant, job_id, after, script, output}."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise EnvironmentProblem("--submit slurm: sbatch is not installed here (Debian: slurm-client); submit from "
                                 "a host of the cluster, or use the JSON for another scheduler")
    for a in sbatch_args:
        if not a.startswith("--") or any(a.startswith(f"--{o}") for o in ("dependency", "output", "wrap")):
            raise UsageError(f"--sbatch-arg {a!r}: give sbatch options as --name=value; nodeforge sets "
                             "--dependency, --output and the script itself")
    out = build_dir(root) / "matrix" / digest([v.plan.key for v in found] + sbatch_args)[:16]
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[dict[str, Any]] = []
    for i, (v, waits) in enumerate(zip(found, dependencies(found), strict=True)):
        path = out / f"{i:02d}-{_job_name(v)}.sh"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(script(v, root.resolve()))
        tmp.chmod(0o755)
        os.replace(tmp, path)
        after = [jobs[w]["job_id"] for w in waits]
        argv = [sbatch, "--parsable", f"--job-name={_job_name(v)}", f"--output={out}/{path.stem}.%j.out",
                *([f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"] if after else []),
                *sbatch_args, str(path)]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            done = ", ".join(f"{j['variant']} (job {j['job_id']})" for j in jobs) or "none"
            raise EnvironmentProblem(f"sbatch refused variant {v.name}: {p.stderr.strip() or p.stdout.strip()}\n"
                                     f"submitted before it: {done} (scancel them to start again)")
        job_id = p.stdout.strip().split(";")[0]
        jobs.append({"variant": v.name, "job_id": job_id, "after": after, "script": str(path),
                     "output": f"{out}/{path.stem}.{job_id}.out"})
    return jobs
