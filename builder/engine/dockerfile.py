"""Generated Dockerfiles and build contexts: one build stage per nodeforge layer, readable, and
buildable by any Dockerfile builder (no BuildKit-only syntax: the legacy builder must take it)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..compose.phases import engine_steps, standalone_install
from ..definitions import destination
from ..definitions.load import BOOT_PHASE, PACKAGE_PHASE
from ..definitions.quoting import dockerfile_comment, dockerfile_json, dockerfile_word
from ..errors import NodeforgeError
from ..plan import BuildPlan, ContextFile, LayerStep

# written into every directory `nodeforge render` makes; only such a directory is ever replaced
RENDER_MARKER = ".nodeforge-render"

APPLY_DIR = "/usr/lib/nodeforge/layers"
FULL_STAGE = "nodeforge-full"  # the stage a cut step copies from (compose.cut)


def _files(step: LayerStep) -> list[ContextFile]:
    files = list(step.files)
    if step.apply:
        files.append(ContextFile(f"{APPLY_DIR}/{step.layer}.sh", "0755", "root", "root", "", "apply",
                                 step.apply))
    return files


def fragment(step: LayerStep, prefix: str, epoch: int | None = None) -> str:
    """One engine step. Its scripts run with SOURCE_DATE_EPOCH (the image's), so that tools which
    stamp times (useradd, initramfs-tools, ...) stamp that one."""
    title = {PACKAGE_PHASE: "package phase", BOOT_PHASE: "boot configuration"}.get(step.layer, f"layer {step.layer}")
    lines = [dockerfile_comment(f"{title}: {step.summary}"), f"# key {step.key}"]
    if _files(step):
        lines.append(f"COPY {prefix}/root/ /")
    if step.apply:
        # no build argument for extra CAs: the legacy builder writes build arguments into the image's
        # history; nodeforge runs a step with wheels as a container instead (engine.offline, engine.trust)
        env = ["/usr/bin/env", f"SOURCE_DATE_EPOCH={epoch}"] if epoch is not None else []
        lines.append(f"RUN {dockerfile_json([*env, '/bin/bash', f'{APPLY_DIR}/{step.layer}.sh'])}")
    if step.cut is not None:  # compose.cut: the directory the layer assembled, alone, with the whole env
        lines += [f"# cut: the image is {dockerfile_comment(step.cut).removeprefix('# ')} alone on an empty base",
                  "FROM scratch", f"COPY --from={FULL_STAGE} {dockerfile_json([step.cut.rstrip('/') + '/', '/'])}"]
    if step.env:
        # single-quoted words: the Dockerfile lexer expands no $ in them
        lines.append("ENV " + " \\\n    ".join(f"{dockerfile_word(k)}={dockerfile_word(v)}" for k, v in step.env))
    if step.entrypoint is not None:
        # exec form; CMD is reset by ENTRYPOINT, so the entrypoint itself defaults to a shell
        lines.append(f"ENTRYPOINT {dockerfile_json(step.entrypoint)}")
    if len(lines) == 2:
        lines.append("# (nothing to do)")
    return "\n".join(lines) + "\n"


def label_fragment(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "LABEL " + " \\\n      ".join(f"{dockerfile_word(k)}={dockerfile_word(v)}"
                                        for k, v in sorted(labels.items())) + "\n"


def write_context(step: LayerStep, dest: Path, whole: bool = False) -> None:
    """The build context of an engine step; whole: a layer with all its files and its package phase
    as a script of its own (the Packer export applies layers one by one)."""
    root = dest / "root"
    root.mkdir(parents=True, exist_ok=True)
    files = _files(step)
    if whole and (step.packages or step.install):
        files.append(ContextFile(f"{APPLY_DIR}/{step.layer}.install.sh", "0755", "root", "root", "", "install",
                                 standalone_install(step)))
    for f in files:
        target = root / f.path.lstrip("/")
        if ".." in Path(f.path).parts or not f.path.strip("/"):  # the grammar refuses them; never write outside
            raise NodeforgeError(f"layer {step.layer}: file path {f.path!r} leaves the image root")
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.content is not None:
            target.write_text(f.content)
        else:
            assert f.source
            shutil.copyfile(f.source, target)
        os.chmod(target, int(f.mode, 8))


def step_dockerfile(step: LayerStep, parent_ref: str, epoch: int | None = None) -> str:
    stage = f" AS {FULL_STAGE}" if step.cut is not None else ""
    return f"FROM {parent_ref}{stage}\n" + fragment(step, ".", epoch)


def render(plan: BuildPlan, dest: Path, base_hint: str, bootstrap: str, labels: dict[str, str],
           project: Path | None = None) -> None:
    """Write a whole build context a person can read and build elsewhere: into a temporary
    directory beside dest, renamed into place once complete (a failure leaves nothing)."""
    destination.check(dest, project or Path.cwd(), "render")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.render-", dir=dest.parent))
    old = None
    try:
        _write_render(plan, tmp, dest.name, base_hint, bootstrap, labels)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / "ctx")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _write_render(plan: BuildPlan, tmp: Path, name: str, base_hint: str, bootstrap: str,
                  labels: dict[str, str]) -> None:
    os.chmod(tmp, 0o755)
    parts = [dockerfile_comment(f"nodeforge image {plan.image}: {plan.summary}"),
             f"# Build: docker build --build-arg BASE=<base image> {name}",
             f"# The base is {base_hint}" + (" (recreate it with ./bootstrap.sh)" if bootstrap else ""),
             f"ARG BASE={dockerfile_word(base_hint)}",
             "FROM ${BASE}" + (f" AS {FULL_STAGE}" if any(s.cut is not None for s in plan.steps) else ""), ""]
    parts.append("# Phases: every layer's packages in one step, then each layer's files, users, services\n"
                 "# and steps in layer order; a node image's initramfs is generated after the last one,\n"
                 "# and its boot configuration (every layer's sysctl and kernel arguments) after that.\n")
    steps = engine_steps(plan)
    for i, step in enumerate([*steps, *([plan.boot] if plan.boot else [])], start=1):
        d = f"{i:02d}-{step.layer}"
        if step is plan.boot:
            parts.append("# (nodeforge generates the initramfs here: update-initramfs after the last layer)\n")
        write_context(step, tmp / d)
        parts.append(fragment(step, d, plan.base.epoch))
    parts.append(label_fragment(labels))
    if plan.user:
        parts.append(f"USER {dockerfile_word(plan.user)}\n")
    (tmp / "Dockerfile").write_text("\n".join(parts))
    if bootstrap:
        (tmp / "bootstrap.sh").write_text(bootstrap)
        os.chmod(tmp / "bootstrap.sh", 0o755)
    (tmp / "plan.json").write_text(json.dumps(plan.to_json(), indent=2, default=str) + "\n")
    (tmp / RENDER_MARKER).write_text(f"made by nodeforge render of image {plan.image}; render replaces this "
                                     "directory whole\n")
