"""Reproducibility check (`nodeforge repro IMAGE`): build an image twice, each build in isolation
(its own build directory and its own engine repositories, so nothing of ours is shared), and compare: the normalised OCI
image digests (and, when they differ, the layers down to the file), and for node images every
output file (inside tar, cpio and ext4 outputs). Exit 0 identical, 1 different, 2 on errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..compose.image import compose, output_name
from ..definitions.load import Tree
from ..engine import client as engine
from ..errors import EXIT_FAIL, EXIT_OK, BuildFailed
from ..export import oci
from ..paths import BASE_REPO, BUILD_DIR_VARIABLE, CACHE_REPO, NAMESPACE_VARIABLE
from . import compare

SIDES = ("a", "b")


def build_command(root: Path, image: str, config: str | None, sets: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "builder", "--root", str(root), "build", image]  # the log says where time went
    if config:
        cmd += ["--config", config]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def build_isolated(cmd: list[str], build_dir: Path, namespace: str, side: str = "") -> None:
    """Run `cmd` (a build) with its own build directory and engine namespace ("": the default one);
    its output goes to a log beside the build and, line by line under the side's name, to stderr."""
    env = {**os.environ, BUILD_DIR_VARIABLE: str(build_dir), NAMESPACE_VARIABLE: namespace}
    log = build_dir.parent / f"{namespace or build_dir.name}.log"
    with log.open("w") as f, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, errors="replace") as proc:
        for line in proc.stdout or ():
            f.write(line)
            print(f"repro {side or build_dir.name}: {line}", end="", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise BuildFailed(f"build {namespace} failed (exit {proc.returncode}; log {log}):\n{tail}")


def tags_of_chain(tree: Tree, image: str, config: str | None, sets: list[Any]) -> list[str]:
    """The output tags of the image and the images of ours it builds on (each build retags them)."""
    tags: list[str] = []
    name: str | None = image
    while name:
        plan = compose(tree, name, config, sets)
        tags += plan.tags
        name = plan.base.image
    return tags


def image_ids(c: docker.DockerClient, tags: list[str]) -> dict[str, str | None]:
    ids: dict[str, str | None] = {}
    for t in tags:
        try:
            ids[t] = engine.inspect(c, t)["Id"]
        except docker.errors.ImageNotFound:
            ids[t] = None
    return ids


def remove_namespaces(c: docker.DockerClient, namespaces: list[str]) -> None:
    """Remove every engine tag of the given namespaces (and the images only they held)."""
    for ns in namespaces:
        for repo in (f"{CACHE_REPO}-{ns}", f"{BASE_REPO}-{ns}"):
            for img in c.images.list(name=repo):
                for tag in img.tags:
                    if tag.startswith(repo + ":"):
                        c.api.remove_image(tag, noprune=False)


def restore_tags(c: docker.DockerClient, before: dict[str, str | None]) -> None:
    """Point the output tags back where they were before the builds (or remove the new ones)."""
    for tag, old in before.items():
        repo, tg = engine.split_ref(tag)
        try:
            if old:
                c.api.tag(old, repo, tg)
            else:
                c.api.remove_image(tag, noprune=False)
        except docker.errors.APIError:
            pass


def _compare(c: docker.DockerClient, work: Path, plan: Any, ids: list[str], diffoscope: bool) -> list[str]:
    lines: list[str] = []
    digests = []
    for side, image_id in zip(SIDES, ids, strict=True):
        digests.append(oci.export(c, plan.tags[0], plan.base.epoch, work / f"oci-{side}", source=image_id))
    print(f"OCI digest A {digests[0]}\nOCI digest B {digests[1]}")
    if digests[0] != digests[1]:
        lines += ["OCI image differs:", *("  " + line for line in compare.compare_layouts(
            work / "oci-a", work / "oci-b", diffoscope=diffoscope))]
    if plan.kind == "node":
        outs = [work / f"build-{side}" / "images" / output_name(plan) for side in SIDES]
        if all(o.is_dir() for o in outs):
            lines += compare.compare_dirs(outs[0], outs[1], diffoscope=diffoscope)
        else:
            raise BuildFailed(f"no node outputs in {outs[0]} or {outs[1]}: the builds wrote them elsewhere, "
                              "so they cannot be compared")
    return lines


def repro(tree: Tree, image: str, config: str | None, set_args: list[str], sets: list[Any],
          keep: bool = False, diffoscope: bool = True) -> int:
    plan = compose(tree, image, config, sets)
    c = engine.client()
    before = image_ids(c, tags_of_chain(tree, image, config, sets))
    work = Path(tempfile.mkdtemp(prefix=f"nodeforge-repro-{image}-"))
    tag = f"repro{os.getpid()}"
    namespaces = [f"{tag}-{side}" for side in SIDES]
    ids = []
    try:
        for side, ns in zip(SIDES, namespaces, strict=True):
            print(f"[{image}] build {side.upper()} (namespace {ns}) ...", flush=True)
            build_isolated(build_command(tree.root, image, config, set_args), work / f"build-{side}", ns,
                           side)
            ids.append(engine.inspect(c, plan.tags[0])["Id"])
        lines = _compare(c, work, plan, ids, diffoscope)
    finally:
        restore_tags(c, before)
        if not keep:
            remove_namespaces(c, namespaces)
            shutil.rmtree(work, ignore_errors=True)
    if keep:
        print(f"kept: {work} (builds, logs, OCI layouts) and engine tags of {', '.join(namespaces)}")
    if lines:
        print(f"{image}: NOT reproducible; what differs between build A and build B:")
        print("\n".join("  " + line for line in lines))
        return EXIT_FAIL
    print(f"{image}: reproducible (two isolated builds, identical outputs and OCI digest)")
    return EXIT_OK
