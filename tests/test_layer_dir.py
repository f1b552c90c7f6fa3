"""The OCI digest read from the engine's overlay2 layer directories (manifest.layer_dir) is the one
read through `docker save`: for a built node image, a CUDA image and an image whose layers hold
what the engine's tar writer treats specially (hard links, whiteouts, opaque directories, fifos)."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import docker
import pytest

from builder.engine import client as engine
from builder.manifest import image_digest, layer_dir, oci_image
from builder.pipeline import BuildResult

EPOCH = 1735689600

SPECIAL = """FROM {base}
RUN mkdir -p /opt/t/dir /opt/t/gone && echo data > /opt/t/a && ln /opt/t/a /opt/t/b && ln /opt/t/a /opt/t/0first \
 && echo x > /opt/t/gone/f && mkfifo /opt/t/fifo && ln -s a /opt/t/sym
RUN rm -rf /opt/t/gone /opt/t/b /etc/issue && mkdir /opt/t/gone && echo new > /opt/t/gone/g \
 && rm -rf /usr/share/doc/bash && mkdir /usr/share/doc/bash && echo again > /usr/share/doc/bash/README
"""


def both(c: docker.DockerClient, ref: str) -> tuple[str, str]:
    """(the digest from the layer directories, the digest through docker save), no cache."""
    image_id = engine.inspect(c, ref)["Id"]
    local = image_digest._local_layers(c, image_id)
    assert local is not None, "the engine's overlay2 directories are readable here (make setup's engine)"
    config, dirs = local
    from_dirs = oci_image.assemble(config, image_digest._from_directories(config, dirs, EPOCH, {}), EPOCH)
    with tempfile.TemporaryDirectory() as tmp:
        config, layers = oci_image.save(c, image_id, Path(tmp))
        saved = oci_image.normalise(config, layers, EPOCH)
    return from_dirs.digest, saved.digest


@pytest.mark.slow
def test_node_image_digest_from_directories_is_the_saved_one(docker_client: docker.DockerClient,
                                                               built_node_minimal: BuildResult) -> None:
    a, b = both(docker_client, built_node_minimal.id)
    assert a == b


@pytest.mark.slow
def test_special_entries_digest_the_same(docker_client: docker.DockerClient, built_node_minimal: BuildResult) -> None:
    tag = "nodeforge-test/layer-dir-special:1"
    dockerfile = SPECIAL.format(base=built_node_minimal.id)
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
    try:
        info = docker_client.api.inspect_image(tag)
        dirs = [info["GraphDriver"]["Data"]["UpperDir"]]
        entries = {m.name: m for m, _ in layer_dir.entries(Path(dirs[0]))}
        assert any(n.endswith(layer_dir.OPAQUE_MARK) for n in entries), sorted(entries)  # the recreated dirs
        assert "opt/t/.wh.b" in entries and "etc/.wh.issue" in entries
        a, b = both(docker_client, tag)
        assert a == b
    finally:
        docker_client.api.remove_image(tag, force=True)


@pytest.mark.slow
def test_cuda_image_digest_from_directories_is_the_saved_one(docker_client: docker.DockerClient,
                                                               cuda_images: dict[str, BuildResult]) -> None:
    a, b = both(docker_client, cuda_images["cuda-11.8-base-slim"].id)
    assert a == b
