"""Reading an OCI image layout that came from elsewhere (`nodeforge import oci DIR`): untrusted, so
every document (oci-layout, index.json, the image manifest, its config) is read through the one
document reader (definitions.documents) against an OCI schema, and every blob is checked against
its descriptor (sha256 and size) before it is used. A blob is only ever `blobs/sha256/<64 hex>`,
a regular file (no link, FIFO or device). Any other shape is a usage error (exit 2) naming the file
and the key, never a traceback or a hang."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from ..definitions import documents
from ..definitions.spec import Field, Int, ListOf, MapOf, Str, Struct
from ..errors import UsageError
from ..manifest.oci_image import MANIFEST_TYPE

WHAT = "OCI layout"
REMEDY = "give a layout written by `nodeforge export oci` (or skopeo)"
MAX_JSON_BLOB = 4 * 1024 * 1024  # an image manifest or config; layers are hashed as they are read
MAX_LAYER_BLOB = 1 << 40

DIGEST = Str(r"sha256:[0-9a-f]{64}", "a sha256 digest ('sha256:' and 64 lower-case hex digits)", max_len=71)
MEDIA_TYPE = Str(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*", "a media type",
                 max_len=255)
DESCRIPTOR = Struct({
    "mediaType": Field(MEDIA_TYPE, "what the blob is", required=True),
    "digest": Field(DIGEST, "the blob's sha256", required=True),
    "size": Field(Int(min=0, max=MAX_LAYER_BLOB), "the blob's size in bytes", required=True),
    "annotations": Field(MapOf(Str(max_len=1024), Str(max_len=4096)), "annotations", default={}),
}, "a descriptor {mediaType, digest, size}", open=True)
LAYOUT = Struct({"imageLayoutVersion": Field(Str(r"1\.[0-9]+\.[0-9]+", "a layout version 1.x.y", max_len=32),
                                             "the layout's version", required=True)},
                "an oci-layout {imageLayoutVersion}", open=True)
INDEX = Struct({
    "schemaVersion": Field(Int(min=2, max=2), "the index's schema version", required=True),
    "manifests": Field(ListOf(DESCRIPTOR), "the images of the layout", required=True),
}, "an image index {schemaVersion, manifests}", open=True)
MANIFEST = Struct({
    "schemaVersion": Field(Int(min=2, max=2), "the manifest's schema version", required=True),
    "config": Field(DESCRIPTOR, "the image's config", required=True),
    "layers": Field(ListOf(DESCRIPTOR), "the image's layers", required=True),
}, "an image manifest {schemaVersion, config, layers}", open=True)
CONFIG = Struct({
    "architecture": Field(Str(max_len=64), "the CPU architecture", required=True),
    "os": Field(Str(max_len=64), "the operating system", required=True),
    "rootfs": Field(Struct({"type": Field(Str(max_len=64), "layers", required=True),
                            "diff_ids": Field(ListOf(DIGEST), "the layers' uncompressed digests", required=True)},
                           "a rootfs {type, diff_ids}", open=True), "the root filesystem", required=True),
}, "an image config {architecture, os, rootfs}", open=True)


def layout_index(layout: Path) -> dict[str, Any]:
    """The layout's index.json, checked: one image manifest (the one `import oci` copies)."""
    documents.read_json(layout / "oci-layout", LAYOUT, WHAT, REMEDY, limit=4096)
    path = layout / "index.json"
    index = documents.read_json(path, INDEX, WHAT, REMEDY, limit=MAX_JSON_BLOB)
    manifests = index["manifests"]
    if len(manifests) != 1:
        raise UsageError(f"{WHAT} {path}: manifests: expected one image, found {len(manifests)}; {REMEDY}")
    if manifests[0]["mediaType"] != MANIFEST_TYPE:
        raise UsageError(f"{WHAT} {path}: manifests[0].mediaType: expected {MANIFEST_TYPE}, found "
                         f"{manifests[0]['mediaType']!r}; {REMEDY}")
    return index


def _open_blob(layout: Path, descriptor: dict[str, Any]) -> tuple[Path, int]:
    """The blob's path and an open descriptor of it: a regular file of the descriptor's size."""
    path = layout / "blobs" / "sha256" / descriptor["digest"].removeprefix("sha256:")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError as e:
        raise UsageError(f"{WHAT} {layout}: blob {descriptor['digest']} cannot be read ({e.strerror}); "
                         f"{REMEDY}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != descriptor["size"]:
        os.close(fd)
        found = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else "not a regular file"
        raise UsageError(f"{WHAT} {layout}: blob {descriptor['digest']}: expected {descriptor['size']} bytes, "
                         f"found {found}; {REMEDY}")
    return path, fd


def _read_blob(layout: Path, descriptor: dict[str, Any], limit: int | None) -> bytes | None:
    """The blob's bytes (limit given) or None (only hashed), once its sha256 and size are checked."""
    path, fd = _open_blob(layout, descriptor)
    if limit is not None and descriptor["size"] > limit:
        os.close(fd)
        raise UsageError(f"{WHAT} {path}: {descriptor['size']} bytes, more than the {limit} a document may have; "
                         f"{REMEDY}")
    h, parts, total = hashlib.sha256(), [], 0
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            total += len(block)
            if limit is not None:
                parts.append(block)
            if total > descriptor["size"]:
                break
    if total != descriptor["size"] or "sha256:" + h.hexdigest() != descriptor["digest"]:
        raise UsageError(f"{WHAT} {path}: its content does not match its digest {descriptor['digest']} "
                         f"(sha256:{h.hexdigest()}, {total} bytes); the layout is damaged or altered: {REMEDY}")
    return b"".join(parts) if limit is not None else None


def _document(layout: Path, descriptor: dict[str, Any], spec: Struct) -> dict[str, Any]:
    data = _read_blob(layout, descriptor, MAX_JSON_BLOB)
    assert data is not None
    path = layout / "blobs" / "sha256" / descriptor["digest"].removeprefix("sha256:")
    return documents.check(documents.parse_json(data, path, WHAT, REMEDY), spec, path, WHAT, REMEDY)


def verify_layout(layout: Path) -> str:
    """Check the whole layout (documents against their schemas, blobs against their digests);
    returns the image manifest's digest."""
    if not layout.is_dir():
        raise UsageError(f"{layout} is not an OCI layout (not a directory); {REMEDY}")
    entry = layout_index(layout)["manifests"][0]
    manifest = _document(layout, entry, MANIFEST)
    _document(layout, manifest["config"], CONFIG)
    for layer in manifest["layers"]:
        _read_blob(layout, layer, None)
    return str(entry["digest"])
