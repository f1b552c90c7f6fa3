"""OCI image layouts: a built image written as a normalised layout (oci-layout, index.json,
blobs/sha256) by its reproducible digest (see manifest.oci_image), and a layout copied into a
registry by digest with skopeo (an air-gapped site's import)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker

from ..definitions import destination
from ..errors import BuildFailed, EnvironmentProblem, UsageError
from ..manifest.oci_image import IMAGE_NAME, MANIFEST_TYPE, normalise_config, save, write_layout
from .layout import layout_index, verify_layout

__all__ = ["MANIFEST_TYPE", "export", "import_layout", "layout_index", "layout_repository", "manifest_digest",
           "normalise_config", "verify_layout", "write_layout"]

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY = re.compile(rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*")
COMMAND = "export oci"


def _repository_of(ref: str) -> str:
    repo, sep, tag = ref.rpartition(":")
    return repo if sep and "/" not in tag else ref


def export(c: docker.DockerClient, ref: str, epoch: int, out: Path, source: str | None = None,
           project: Path | None = None) -> str:
    """Write the image `ref` (or the engine image `source`, named `ref`) as a normalised OCI layout
    to `out`, atomically (a complete layout or none). `out` follows builder.definitions.destination:
    a new or empty directory, or a layout this command wrote of the same repository (replaced
    whole); never another layout, other content or the project tree. Returns the manifest digest."""
    out = out.absolute()
    with (destination.replacing(out, project, COMMAND, f"image {_repository_of(ref)}") as layout,
          tempfile.TemporaryDirectory(prefix=f".{out.name}.saved-", dir=out.parent) as work):
        config, layers = save(c, source or ref, Path(work))
        return write_layout(config, layers, ref, epoch, layout)


def manifest_digest(layout: Path) -> str:
    return str(layout_index(layout)["manifests"][0]["digest"])


def layout_repository(layout: Path) -> str:
    """The repository the layout's image was exported from (its image-name annotation, tag cut off)."""
    name = str(layout_index(layout)["manifests"][0]["annotations"].get(IMAGE_NAME, ""))
    return _repository_of(name)


def import_layout(layout: Path, registry: str, repository: str | None = None) -> str:
    """Copy the layout's image into `registry` by digest with skopeo; returns the pushed reference."""
    digest = verify_layout(layout)  # every document checked, every blob by its digest and size
    if shutil.which("skopeo") is None:
        raise EnvironmentProblem("skopeo is not installed; install it (Debian package skopeo, `make setup`)")
    repository = repository or layout_repository(layout)
    if not repository:
        raise UsageError(f"{layout} names no repository; give --repository NAME")
    if not REPOSITORY.fullmatch(repository):
        raise UsageError(f"{layout}: expected a repository name (lower-case letters, digits, . _ - and /, "
                         f"optionally after HOST[:PORT]/), found {repository!r}; give --repository NAME")
    dest = f"{registry.rstrip('/')}/{repository}@{digest}"
    host = registry.split("/")[0].rsplit(":", 1)[0]
    tls = ["--dest-tls-verify=false"] if host in ("127.0.0.1", "localhost", "[::1]") else []
    proc = subprocess.run(["skopeo", "copy", "--preserve-digests", *tls, f"oci:{layout}", f"docker://{dest}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildFailed(f"skopeo could not copy {layout} to {dest}:\n{proc.stderr.strip()[-2000:]}")
    return dest
