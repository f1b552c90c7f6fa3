"""OCI image layouts: a built image written as a normalised layout (oci-layout, index.json,
blobs/sha256) by its reproducible digest (see manifest.oci_image), and a layout copied into a
registry by digest with skopeo (an air-gapped site's import)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker

from ..errors import BuildFailed, EnvironmentProblem, UsageError
from ..manifest.oci_image import IMAGE_NAME, MANIFEST_TYPE, normalise_config, save, write_layout

__all__ = ["MANIFEST_TYPE", "export", "import_layout", "layout_repository", "manifest_digest", "normalise_config",
           "write_layout"]


def export(c: docker.DockerClient, ref: str, epoch: int, out: Path, source: str | None = None) -> str:
    """Write the image `ref` (or the engine image `source`, named `ref`) as a normalised OCI layout
    to `out`, atomically (a complete layout or none); an existing layout there is replaced, any other
    existing content is refused. Returns the manifest digest."""
    out = out.absolute()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "oci-layout").is_file())):
        raise UsageError(f"{out} exists and is not an OCI layout; give a new or empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        layout, work = Path(tmp) / "layout", Path(tmp) / "saved"
        work.mkdir()
        config, layers = save(c, source or ref, work)
        digest = write_layout(config, layers, ref, epoch, layout)
        if out.exists():
            os.replace(out, Path(tmp) / "old")
        os.replace(layout, out)
    return digest


def manifest_digest(layout: Path) -> str:
    index = json.loads((layout / "index.json").read_text())
    return str(index["manifests"][0]["digest"])


def layout_repository(layout: Path) -> str:
    """The repository the layout's image was exported from (its image-name annotation, tag cut off)."""
    index = json.loads((layout / "index.json").read_text())
    name = str(index["manifests"][0].get("annotations", {}).get(IMAGE_NAME, ""))
    repo, sep, tag = name.rpartition(":")
    return repo if sep and "/" not in tag else name


def import_layout(layout: Path, registry: str, repository: str | None = None) -> str:
    """Copy the layout's image into `registry` by digest with skopeo; returns the pushed reference."""
    if shutil.which("skopeo") is None:
        raise EnvironmentProblem("skopeo is not installed; install it (Debian package skopeo, `make setup`)")
    if not (layout / "oci-layout").is_file():
        raise UsageError(f"{layout} is not an OCI layout (no oci-layout file); write one with `nodeforge export oci`")
    digest = manifest_digest(layout)
    repository = repository or layout_repository(layout)
    if not repository:
        raise UsageError(f"{layout} names no repository; give --repository NAME")
    dest = f"{registry.rstrip('/')}/{repository}@{digest}"
    host = registry.split("/")[0].rsplit(":", 1)[0]
    tls = ["--dest-tls-verify=false"] if host in ("127.0.0.1", "localhost", "[::1]") else []
    proc = subprocess.run(["skopeo", "copy", "--preserve-digests", *tls, f"oci:{layout}", f"docker://{dest}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildFailed(f"skopeo could not copy {layout} to {dest}:\n{proc.stderr.strip()[-2000:]}")
    return dest
