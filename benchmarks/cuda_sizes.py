"""CUDA image sizes: ours against one plain Dockerfile installing the same packages on the same base,
on disk (`docker image inspect`) and to pull (the compressed layers and config of the manifest a
push to a local docker-registry made), with the goals of the slim base and NVIDIA's published
figures beside them (reference, not measured here: no registry can be pulled from).

The plain Dockerfile is what one writes by hand: `apt-get install -y` (recommends included, lists
kept) and, for the wheel-sourced versions, pip installing the same wheels at the same versions. Its
base is our container-base, a Debian slim bootstrapped here (the debian:bookworm-slim equivalent).
`python benchmarks/cuda_sizes.py [IMAGE...]` prints a table; run() returns the rows."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# disk goals (issue: a slim base that keeps apt), in bytes
GOALS = {"container-base": 80e6, "container-base-trixie": 80e6, "cuda-11.8-base": 85e6, "cuda-12.9-base": 85e6,
         "cuda-13.0-base": 85e6, "cuda-13.0-base-distroless": 40e6, "cuda-13.0-base-debian13": 85e6,
         "cuda-12.9-base-debian13": 85e6, "cuda-13.0-base-distroless-debian13": 40e6}
# Debian's slim and NVIDIA's own images, as published (shared/reference/peers-2026.md: sources named there)
REFERENCE = {"container-base": "debian:bookworm-slim ~75 MB", "container-base-trixie": "debian:trixie-slim",
             "base": "nvidia/cuda:12.0.1-base-ubuntu22.04 237 MB disk (docker images listing)",
             "runtime": "nvidia/cuda:12.1.1-runtime 2.25 GB disk, 1.3 GB pull (skypilot#4122)",
             "devel": "nvidia/cuda:12.1.1-devel 7 GB disk, 3.6 GB pull (skypilot#4122)",
             "cudnn-runtime": "nvidia/cuda:12.1.1-cudnn8-runtime-ubuntu22.04 3.38 GB disk (third-party listing)",
             "cudnn-devel": "nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04 12.9 GB disk (nvidia-container-toolkit#854)"}
IMAGES = ["cuda-11.8-base", "cuda-11.8-runtime", "cuda-11.8-devel", "cuda-12.9-base", "cuda-12.9-runtime",
          "cuda-13.0-base", "cuda-13.0-runtime", "cuda-13.0-devel",
          "cuda-13.0-runtime-cublas", "cuda-13.0-runtime-cufft", "cuda-13.0-runtime-nccl",
          "cuda-12.9-cudnn-runtime", "cuda-13.0-cudnn-runtime", "cuda-13.0-cudnn-devel", "cuda-13.0-base-distroless",
          "cuda-12.9-base-debian13", "cuda-12.9-runtime-debian13", "cuda-13.0-base-debian13",
          "cuda-13.0-runtime-debian13", "cuda-13.0-devel-debian13", "cuda-13.0-base-distroless-debian13"]


def plain_dockerfile(base_ref: str, apt: list[str], wheels: list[str]) -> str:
    lines = [f"FROM {base_ref}"]
    if apt:
        lines.append("RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y " + " ".join(apt))
    if wheels:
        lines.append("ARG NODEFORGE_CA_BUNDLE=")
        lines.append("RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip && "
                     "{ [ -z \"$NODEFORGE_CA_BUNDLE\" ] || { printf '%s\\n' \"$NODEFORGE_CA_BUNDLE\" "
                     ">>/etc/ssl/certs/ca-certificates.crt; }; } && "
                     "pip install --break-system-packages " + " ".join(wheels))
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def registry_if_installed() -> Iterator[str | None]:
    """The tests' local registry (tests/support/registry.py) in a temporary directory; None without one."""
    if shutil.which("docker-registry") is None:
        yield None
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from support.registry import local_registry

    with tempfile.TemporaryDirectory() as d, local_registry(Path(d)) as registry:
        yield registry


def pull_size(c: docker.DockerClient, registry: str, local: str) -> int:
    """What a node downloads for `local`: the compressed layers and the config of the manifest a
    push of it to `registry` made."""
    from builder import publish
    from builder.engine import client as engine

    pushed = publish.push_tag(c, local, local, registry)
    repo, _ = engine.split_ref(pushed.tag.removeprefix(registry + "/"))
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{pushed.digest}",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        manifest = json.load(r)
    return int(manifest["config"]["size"]) + sum(int(layer["size"]) for layer in manifest["layers"])


def run(images: list[str] | None = None) -> list[tuple[str, ...]]:
    from builder import lockfile as lock
    from builder.definitions.load import load_tree
    from builder.engine import client as engine
    from builder.engine import trust
    from builder.engine.steps import engine_build
    from builder.pipeline import Builder
    from builder.progress import Progress

    tree = load_tree(ROOT)
    builder = Builder(tree, None, [], Progress(quiet=True))
    names = images or IMAGES
    builder.build(names, jobs=2)
    c = engine.client()
    sizes: dict[str, tuple[int, int]] = {}  # name -> (ours, plain) on disk
    for name in names:
        apt: list[str] = []
        wheels: list[str] = []
        current: str | None = name
        while builder.results[current or ""].plan.base.kind == "image":  # up to the bootstrapped base
            current = builder.results[current or ""].plan.base.image
        base = builder.results[current or ""]  # container-base, or container-base-trixie for Debian 13
        current = name
        while current and current != base.image:  # the packages of the whole chain above it
            locked = lock.read(ROOT, current)
            plan = builder.results[current].plan
            for step in plan.steps:
                apt += [p.partition("=")[0] for p in step.packages if not p.startswith("unzip")]
                if locked:
                    wheels += [f"{n}=={w['version']}" for n, w in lock.wheels(locked, step.layer).items()]
            current = plan.base.image
        tag = f"nodeforge-bench/plain-{name}:latest"
        ca = trust.extra_ca()
        with tempfile.TemporaryDirectory() as tmp:
            engine_build(c, Path(tmp), plain_dockerfile(base.ref, sorted(set(apt)), sorted(set(wheels))), tag,
                          ROOT / "build" / "logs" / "bench" / f"plain-{name}.log",
                          {"NODEFORGE_CA_BUNDLE": ca} if ca and wheels else None)
        sizes[name] = (builder.results[name].size, engine.inspect(c, tag)["Size"])
    header = ("image", "disk MB", "pull MB", "plain disk", "plain pull", "saved disk", "goal", "published (reference)")
    rows: list[tuple[str, ...]] = [header]

    def mb(size: int | None) -> str:
        return "-" if size is None else f"{size / 1e6:.1f}"

    with registry_if_installed() as registry:
        bases = [b for b in ("container-base", "container-base-trixie") if b in builder.results]
        for name in [*bases, *names]:
            ours = builder.results[name]
            disk, plain = sizes.get(name, (ours.size, None))
            pull = pull_size(c, registry, ours.tags[0]) if registry else None
            plain_pull = pull_size(c, registry, f"nodeforge-bench/plain-{name}:latest") if registry and plain else None
            goal = GOALS.get(name)
            parts = name.split("-")  # cuda-13.0-runtime-nccl: runtime; cuda-13.0-cudnn-devel: cudnn-devel
            kind = (name if name.startswith("container-base") else "-".join(parts[2:4]) if parts[2] == "cudnn"
                    else parts[2])
            rows.append((name, mb(disk), mb(pull) if registry else "n/a", mb(plain), mb(plain_pull),
                         f"{100 * (plain - disk) / plain:.1f}%" if plain else "-",
                         "-" if goal is None else f"<= {goal / 1e6:.0f} MB {'met' if disk <= goal else 'MISSED'}",
                         REFERENCE.get(kind, "")))
    return rows


WIDTHS = (36, 8, 8, 10, 10, 10, 16, 60)


def main() -> None:
    for row in run(sys.argv[1:] or None):
        print("  ".join(f"{c!s:<{w}}" for c, w in zip(row, WIDTHS, strict=True)))


if __name__ == "__main__":
    main()
