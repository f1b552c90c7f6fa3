"""SBOM: an SPDX 2.3 JSON document generated from the image's own package databases - dpkg's
status file and the *.dist-info metadata of unpacked wheels - stored beside the image
(build/images/<image>/sbom.spdx.json, or build/images/<image>@<config>/ for a config that changes
the image) and named in the image by its sha256 (a label)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker

from ..compose.cut import is_cut
from ..compose.image import output_name
from ..debian import parse_dpkg_status
from ..errors import BuildFailed
from ..paths import build_dir
from ..plan import BuildPlan
from .client import SESSION_LABEL

LABEL = "io.nodeforge.sbom.sha256"
# where wheels are unpacked (packages.pip-target) or installed
WHEEL_ROOTS = ("/opt", "/usr/local/lib")
_MARK = "@@nodeforge-wheel "
_READ = (f"cat /var/lib/dpkg/status; for m in $(find {' '.join(WHEEL_ROOTS)} -path '*.dist-info/METADATA' "
         f"2>/dev/null | sort); do echo; echo '{_MARK}'\"$m\"; head -n 40 \"$m\"; done")


def path_for(root: Path, output: str) -> Path:
    """output: compose.image.output_name of the plan (NAME or NAME@CONFIG)."""
    return build_dir(root) / "images" / output / "sbom.spdx.json"


_OUT = "/tmp/nodeforge-sbom.txt"


def _read(c: docker.DockerClient, ref: str) -> str:
    """The package databases, written to a file in a container and read back as an archive: the
    engine's log stream of a short-lived container can lose its tail, an archive cannot."""
    box = c.containers.create(ref, ["-c", f"{{ {_READ}; }} > {_OUT}"], entrypoint=["/bin/sh"], user="root",
                              labels={SESSION_LABEL: "sbom"}, network_mode="none")
    try:
        box.start()
        status = box.wait(timeout=300)
        if status.get("StatusCode", 1) != 0:
            raise BuildFailed(f"reading the package databases of {ref} failed (exit {status.get('StatusCode')})")
        stream, _ = box.get_archive(_OUT)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            assert member is not None
            return member.read().decode(errors="replace")
    finally:
        box.remove(force=True)


def _archive(box: Any, path: str) -> tarfile.TarFile | None:
    try:
        stream, _ = box.get_archive(path)
    except docker.errors.NotFound:
        return None
    return tarfile.open(fileobj=io.BytesIO(b"".join(stream)))


def _read_unstarted(c: docker.DockerClient, ref: str) -> str:
    """The same text as _read, for an image with no shell (compose.cut): read as archives from a
    container that is created and never started."""
    box = c.containers.create(ref, ["/nodeforge-never-started"], entrypoint=[], labels={SESSION_LABEL: "sbom"},
                              network_mode="none")
    try:
        status = _archive(box, "/var/lib/dpkg/status")
        member = status.extractfile(status.getmembers()[0]) if status else None
        text = member.read().decode(errors="replace") if member else ""
        metadata: dict[str, str] = {}
        for root in WHEEL_ROOTS:
            tar = _archive(box, root)
            for m in tar.getmembers() if tar else []:
                f = tar.extractfile(m) if tar and m.isreg() and m.name.endswith(".dist-info/METADATA") else None
                if f is not None:  # what `head -n 40` prints
                    lines = f.read().decode(errors="replace").splitlines(keepends=True)[:40]
                    metadata[f"{root.rsplit('/', 1)[0]}/{m.name}"] = "".join(lines)
        for path in sorted(metadata):
            text += f"\n{_MARK}{path}\n{metadata[path]}"
        return text
    finally:
        box.remove(force=True)


def wheels_of(text: str) -> list[dict[str, str]]:
    found = []
    for chunk in text.split(_MARK)[1:]:
        head, _, body = chunk.partition("\n")
        fields = dict(line.split(": ", 1) for line in body.split("\n\n")[0].splitlines() if ": " in line)
        if fields.get("Name"):
            found.append({"name": fields["Name"], "version": fields.get("Version", ""),
                          "license": fields.get("License", ""), "path": head.strip()})
    return found


def _spdx_id(kind: str, name: str, n: int) -> str:
    return f"SPDXRef-{kind}-{re.sub(r'[^A-Za-z0-9.-]', '-', name)}-{n}"


def document(plan: BuildPlan, text: str) -> dict[str, Any]:
    dpkg = parse_dpkg_status(text.split(_MARK)[0])
    created = datetime.fromtimestamp(plan.base.epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    image_id = "SPDXRef-image"
    packages: list[dict[str, Any]] = [{
        "name": plan.image, "SPDXID": image_id, "versionInfo": plan.version, "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False, "primaryPackagePurpose": "CONTAINER", "comment": f"nodeforge key {plan.key}"}]
    rels = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_id}]
    for n, f in enumerate((v for _, v in sorted(dpkg.items())), start=1):
        name, arch = f["Package"], f.get("Architecture", "")
        pkg: dict[str, Any] = {"name": name, "SPDXID": _spdx_id("deb", name, n), "versionInfo": f.get("Version", ""),
               "supplier": f"Organization: {f['Maintainer']}" if f.get("Maintainer") else "NOASSERTION",
               "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
               "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION",
               "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                 "referenceLocator": f"pkg:deb/debian/{name}@{f.get('Version', '')}?arch={arch}"}]}
        packages.append(pkg)
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pkg["SPDXID"]})
    for n, w in enumerate(wheels_of(text), start=1):
        pkg = {"name": w["name"], "SPDXID": _spdx_id("pypi", w["name"], n), "versionInfo": w["version"],
               "downloadLocation": "NOASSERTION", "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
               "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION",
               "comment": f"wheel metadata {w['path']}" + (f"; License: {w['license']}" if w["license"] else ""),
               "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                 "referenceLocator": f"pkg:pypi/{w['name'].lower()}@{w['version']}"}]}
        packages.append(pkg)
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pkg["SPDXID"]})
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{plan.image} {plan.version}",
        "documentNamespace": f"https://nodeforge.invalid/spdx/{plan.image}/{plan.key}",
        "creationInfo": {"created": created, "creators": ["Tool: nodeforge"]},
        "packages": packages, "relationships": rels,
    }


def write(c: docker.DockerClient, ref: str, plan: BuildPlan, root: Path) -> tuple[Path, str]:
    """The SBOM of the image's file system (ref), written once per content key; (path, sha256)."""
    path = path_for(root, output_name(plan))
    if path.is_file():
        data = path.read_bytes()
        try:
            if json.loads(data).get("documentNamespace", "").endswith("/" + plan.key):
                return path, hashlib.sha256(data).hexdigest()
        except ValueError:
            pass
    text = _read_unstarted(c, ref) if is_cut(plan) else _read(c, ref)
    data = (json.dumps(document(plan, text), indent=1) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path, hashlib.sha256(data).hexdigest()


def counts(doc: dict[str, Any]) -> dict[str, int]:
    """Packages per package manager (deb, pypi), from the purls."""
    out: dict[str, int] = {}
    for p in doc["packages"]:
        for ref in p.get("externalRefs", []):
            kind = ref["referenceLocator"].split(":", 1)[1].split("/", 1)[0]
            out[kind] = out.get(kind, 0) + 1
    return out
