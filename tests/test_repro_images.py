"""The project's images built twice give the same bytes: node-minimal, gpu-node (dgx-h100, the
configuration the suite builds) and cuda-12.9-base.

Build A uses the suite's engine cache (its steps are the ones the other tests built, perhaps long
ago) in a build directory of its own; build B shares nothing of ours with it: its own build
directory and its own engine namespace, so every step runs again. Every output of a node (disks,
netboot artifacts, checksums, SBOM, rollout manifest and provenance) has the same sha256, and the
manifests carry the same normalised OCI digest. Build B's engine tags are removed afterwards and
the output tags point where they did before."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from support.offline import offline_sets, offline_sources

from builder.compose.image import compose, output_name
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.plan import sha256_file
from builder.repro import compare, twice

ROOT = Path(__file__).resolve().parent.parent
NODE_OUTPUTS = ("disk.raw", "disk.qcow2", "vmlinuz", "initrd.img", "rootfs.tar.gz", "boot.ipxe", "SHA256SUMS",
                "sbom.spdx.json", "manifest.json", "provenance.intoto.json")
CONTAINER_OUTPUTS = ("sbom.spdx.json", "manifest.json", "provenance.intoto.json")


Builds = Callable[[str, str | None, list[str]], tuple[Path, Path]]


@pytest.fixture
def build_twice(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[Builds]:
    """build_twice(image, config, sets) -> the output directories of build A and build B. Afterwards
    the output tags point where they did before and build B's namespace is gone from the engine."""
    tree = load_tree(ROOT)
    namespace = f"repro{os.getpid()}-b"
    before: dict[str, str | None] = {}

    def run(image: str, config: str | None, sets: list[str]) -> tuple[Path, Path]:
        before.update(twice.image_ids(docker_client, twice.tags_of_chain(tree, image, config, parse_sets(sets))))
        cmd = twice.build_command(ROOT, image, config, sets)
        for side, ns in (("a", ""), ("b", namespace)):
            (tmp_path / f"build-{side}").mkdir()
            twice.build_isolated(cmd, tmp_path / f"build-{side}", ns)
        # a config that changes the image owns NAME@CONFIG (compose.image.output_name)
        out = output_name(compose(tree, image, config, parse_sets(sets)))
        return tmp_path / "build-a" / "images" / out, tmp_path / "build-b" / "images" / out

    try:
        yield run
    finally:
        twice.restore_tags(docker_client, before)
        twice.remove_namespaces(docker_client, [namespace])


def assert_identical(a: Path, b: Path, names: tuple[str, ...]) -> str:
    """Every named output identical in both builds; the manifests' OCI digest."""
    differing = [n for n in names if sha256_file(a / n) != sha256_file(b / n)]
    if differing:
        detail = compare.compare_dirs(a, b, diffoscope=False)
        pytest.fail(f"differ between two builds: {differing}\n" + "\n".join(detail[:80]))
    digest = json.loads((a / "manifest.json").read_text())["image_digest"]
    assert digest.startswith("sha256:") and len(digest) == 71
    return str(digest)


@pytest.mark.slow
def test_node_minimal_twice(build_twice: Builds) -> None:
    a, b = build_twice("node-minimal", "default", [])
    assert_identical(a, b, NODE_OUTPUTS)


@pytest.mark.slow
def test_cuda_base_twice(build_twice: Builds) -> None:
    """cuda-12.9-base: NVIDIA's cudart wheel on container-base, the parent built again too."""
    a, b = build_twice("cuda-12.9-base", None, [])
    assert_identical(a, b, CONTAINER_OUTPUTS)
    parent = assert_identical(a.parent / "container-base", b.parent / "container-base", CONTAINER_OUTPUTS)
    assert json.loads((a / "manifest.json").read_text())["base"]["digest"] == parent


@pytest.fixture
def offline_url() -> Iterator[str]:
    """The stand-in NVIDIA packages at the URL the suite's gpu-node build used (the URL is part of the
    layer keys): the suite's server when it is still up, else one started here."""
    with offline_sources() as url:
        yield url


@pytest.mark.slow
def test_gpu_node_twice(build_twice: Builds, offline_url: str, docker_client: docker.DockerClient) -> None:
    """gpu-node -c dgx-h100 (the driver's DKMS build, fabric manager, the container toolkit from
    the stand-in packages): build B builds every step again, DKMS included."""
    sets = offline_sets(offline_url)[1::2]  # the values of its --set flags
    a, b = build_twice("gpu-node", "dgx-h100", sets)
    assert_identical(a, b, NODE_OUTPUTS)
    tag = json.loads((b / "manifest.json").read_text())["tags"][0]
    assert _in_layers(docker_client, tag, "etc/munge/munge.key") == [], \
        "a layer of the image ships the munge key munge's postinst generated"


def _in_layers(c: docker.DockerClient, ref: str, rel: str) -> list[Path]:
    """The layer directories of an image (overlay2) that hold rel as a regular file: one a later layer
    removes is still shipped (its removal is a whiteout, a character device, in the later layer)."""
    data = c.images.get(ref).attrs["GraphDriver"]["Data"]
    dirs = [Path(data["UpperDir"]), *(Path(d) for d in data.get("LowerDir", "").split(":") if d)]
    return [d / rel for d in dirs if (d / rel).is_file()]
