"""`nodeforge repro`: two isolated builds of a small container image. A layer that writes the build
time into a file makes them differ, and repro names that file; without it they are identical.
Nothing of either build is left in the engine, and the image's tag points where it did before."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = """name: {name}
summary: a small container image for the reproducibility check
kind: container
version: "1.0"
from:
  debian: {{suite: bookworm, components: [main]}}
source-date-epoch: 1735689600
layers: {layers}
outputs: {{tags: ["nodeforge-test/{name}:1.0"]}}
"""


@pytest.fixture(scope="module")
def repro_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("repro-tree")
    shutil.copytree(ROOT / "layers", t / "layers")
    (t / "images").mkdir()
    (t / "images" / "repro-same.yaml").write_text(IMAGE.format(name="repro-same", layers="[note]"))
    (t / "images" / "repro-stamped.yaml").write_text(IMAGE.format(name="repro-stamped", layers="[note, stamp]"))
    (t / "layers" / "note" / "files").mkdir(parents=True)
    (t / "layers" / "note" / "files" / "note.txt").write_text("note\n")
    (t / "layers" / "note" / "layer.yaml").write_text(
        "name: note\nsummary: writes one file\nfiles:\n  - {path: /etc/note.txt, source: note.txt}\n")
    (t / "layers" / "stamp").mkdir()
    (t / "layers" / "stamp" / "layer.yaml").write_text(
        "name: stamp\nsummary: writes the build time (not reproducible on purpose)\n"
        "steps:\n  - name: build time\n    run: date > /etc/build-time\n")
    return t


def repro(tree: Path, image: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), "repro", image, "--no-diffoscope"],
                          capture_output=True, text=True, cwd=ROOT)


def namespaced_tags(c: docker.DockerClient) -> set[str]:
    return {t for img in c.images.list() for t in img.tags
            if "nodeforge-cache-repro" in t or "nodeforge-base-repro" in t}


@pytest.mark.slow
def test_a_layer_writing_the_build_time_is_found(docker_client: docker.DockerClient, repro_tree: Path) -> None:
    before = namespaced_tags(docker_client)  # another run's, interrupted, are not this one's to judge
    proc = repro(repro_tree, "repro-stamped")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT reproducible" in proc.stdout
    differing = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith(("differs:", "only in"))]
    assert differing == ["differs: etc/build-time"], proc.stdout
    assert namespaced_tags(docker_client) <= before, "repro left its engine tags behind"


@pytest.mark.slow
def test_the_same_definitions_build_identical_images(docker_client: docker.DockerClient, repro_tree: Path) -> None:
    proc = repro(repro_tree, "repro-same")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "repro-same: reproducible" in proc.stdout
    digests = {line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("OCI digest")}
    assert len(digests) == 1
    with pytest.raises(docker.errors.ImageNotFound):  # not built before: no tag left behind
        docker_client.api.inspect_image("nodeforge-test/repro-same:1.0")


def test_an_unknown_image_is_a_usage_error(repro_tree: Path) -> None:
    proc = repro(repro_tree, "no-such-image")
    assert proc.returncode == 2 and "no-such-image: no such image" in proc.stderr

