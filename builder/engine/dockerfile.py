"""Generated Dockerfiles and build contexts: one build stage per nodeforge layer, readable, and
buildable by any Dockerfile builder (no BuildKit-only syntax: the legacy builder must take it)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..plan import BuildPlan, ContextFile, LayerStep

APPLY_DIR = "/usr/lib/nodeforge/layers"


def _files(step: LayerStep) -> list[ContextFile]:
    files = list(step.files)
    if step.apply:
        files.append(ContextFile(f"{APPLY_DIR}/{step.layer}.sh", "0755", "root", "root", "", "apply",
                                 step.apply))
    return files


def fragment(step: LayerStep, prefix: str) -> str:
    lines = [f"# layer {step.layer}: {step.summary}", f"# key {step.key}"]
    if _files(step):
        lines.append(f"COPY {prefix}/root/ /")
    if step.apply:
        if step.wheels:  # extra CAs for the wheel downloads (builder.trust); empty by default
            lines.append("ARG NODEFORGE_CA_BUNDLE=")
        lines.append(f'RUN ["/bin/bash", "{APPLY_DIR}/{step.layer}.sh"]')
    if step.env:
        lines.append("ENV " + " \\\n    ".join(f"{k}={json.dumps(v)}" for k, v in step.env))
    if step.entrypoint is not None:
        # exec form; CMD is reset by ENTRYPOINT, so the entrypoint itself defaults to a shell
        lines.append(f"ENTRYPOINT {json.dumps(list(step.entrypoint))}")
    if len(lines) == 2:
        lines.append("# (nothing to do)")
    return "\n".join(lines) + "\n"


def label_fragment(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "LABEL " + " \\\n      ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())) + "\n"


def write_context(step: LayerStep, dest: Path) -> None:
    root = dest / "root"
    root.mkdir(parents=True, exist_ok=True)
    for f in _files(step):
        target = root / f.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.content is not None:
            target.write_text(f.content)
        else:
            assert f.source
            shutil.copyfile(f.source, target)
        os.chmod(target, int(f.mode, 8))


def step_dockerfile(step: LayerStep, parent_ref: str) -> str:
    return f"FROM {parent_ref}\n" + fragment(step, ".")


def render(plan: BuildPlan, dest: Path, base_hint: str, bootstrap: str, labels: dict[str, str]) -> None:
    """Write a whole build context a person can read and build elsewhere."""
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    parts = [f"# nodeforge image {plan.image}: {plan.summary}",
             f"# Build: docker build --build-arg BASE=<base image> {dest.name}",
             f"# The base is {base_hint}" + (" (recreate it with ./bootstrap.sh)" if bootstrap else ""),
             f"ARG BASE={base_hint}", "FROM ${BASE}", ""]
    for i, step in enumerate(plan.steps, start=1):
        d = f"{i:02d}-{step.layer}"
        write_context(step, tmp / d)
        parts.append(fragment(step, d))
    parts.append(label_fragment(labels))
    if plan.user:
        parts.append(f"USER {plan.user}\n")
    (tmp / "Dockerfile").write_text("\n".join(parts))
    if bootstrap:
        (tmp / "bootstrap.sh").write_text(bootstrap)
        os.chmod(tmp / "bootstrap.sh", 0o755)
    (tmp / "plan.json").write_text(json.dumps(plan.to_json(), indent=2, default=str) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
