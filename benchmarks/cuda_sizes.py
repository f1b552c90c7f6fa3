"""CUDA image sizes: ours against one plain Dockerfile installing the same packages on the same base.

The plain Dockerfile is what one writes by hand: `apt-get install -y` (recommends included, lists
kept) and, for the wheel-sourced versions, pip installing the same wheels at the same versions.
`python benchmarks/cuda_sizes.py [IMAGE...]` prints a table; run() returns the rows."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGES = ["cuda-11.8-base", "cuda-11.8-runtime", "cuda-11.8-devel", "cuda-12.9-base", "cuda-12.9-runtime",
          "cuda-13.0-base", "cuda-13.0-runtime", "cuda-13.0-devel"]


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


def run(images: list[str] | None = None) -> list[tuple[str, int, int]]:
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
    base = builder.results["container-base"]
    rows = []
    for name in names:
        apt: list[str] = []
        wheels: list[str] = []
        current: str | None = name
        while current and current != "container-base":  # the packages of the whole chain
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
        rows.append((name, builder.results[name].size, engine.inspect(c, tag)["Size"]))
    return rows


def main() -> None:
    rows = run(sys.argv[1:] or None)
    print(f"{'image':<20} {'nodeforge':>12} {'plain Dockerfile':>17} {'saved':>8}")
    for name, ours, plain in rows:
        print(f"{name:<20} {ours / 1e6:9.0f} MB {plain / 1e6:14.0f} MB {100 * (plain - ours) / plain:7.1f}%")


if __name__ == "__main__":
    main()
