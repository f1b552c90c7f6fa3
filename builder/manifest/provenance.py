"""The provenance of a build: an in-toto Statement v1 with a SLSA provenance v1 predicate, made
from the manifest alone (so it is as deterministic as the manifest: no wall-clock time).

Subjects: the image by its normalised OCI digest (named by its first tag), every output with its
sha256, and the manifest itself. External parameters: what the
user asked for (image, config, --set). Resolved dependencies: the source tree, the base and the
lock files."""

from __future__ import annotations

from typing import Any

from ..lockfile import redact_url

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://nodeforge.dev/build/v1"
NAME = "provenance.intoto.json"


def builder_id(version: str) -> str:
    return f"https://nodeforge.dev/builder@{version}"


def _sha256(value: str | None) -> dict[str, str]:
    return {"sha256": value.removeprefix("sha256:")} if value else {}


def _dependencies(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    deps: list[dict[str, Any]] = []
    source = manifest.get("source")
    if source:
        dep = {"name": "source", "digest": {"gitCommit": source["revision"]}, "annotations": {"dirty": source["dirty"]}}
        if source.get("repository") not in (None, "", "local"):  # a tree without a remote has no address
            dep["uri"] = f"git+{redact_url(source['repository'])}@{source['revision']}"
        deps.append(dep)
    base = manifest["base"]
    base_dep: dict[str, Any] = {"name": f"base:{base.get('name') or base['key']}",
                                "annotations": {"kind": base["kind"], "key": base["key"]}}
    if base.get("digest"):
        base_dep["digest"] = _sha256(base["digest"])
    if base.get("debian"):
        debian = dict(base["debian"])
        for archive in ("mirror", "security"):  # a record never holds a credential
            if debian.get(archive):
                debian[archive] = redact_url(str(debian[archive]))
        base_dep["annotations"]["debian"] = debian
        base_dep["uri"] = str(debian.get("mirror") or "")
    if not base_dep.get("digest") and not base_dep.get("uri"):
        base_dep["content"] = ""  # a ResourceDescriptor needs one of uri, digest, content
    deps.append(base_dep)
    for lock in ([manifest["lock"]] if manifest.get("lock") else []) + list(manifest.get("inherited_locks", [])):
        deps.append({"name": lock["path"], "digest": {"sha256": lock["sha256"]},
                     "annotations": {"image": lock["image"]}})
    return deps


def statement(manifest: dict[str, Any], manifest_name: str, manifest_sha256: str) -> dict[str, Any]:
    subjects = [{"name": manifest["tags"][0], "digest": _sha256(manifest["image_digest"])}] if (
        manifest.get("image_digest") and manifest.get("tags")) else []
    subjects += [{"name": name, "digest": {"sha256": out["sha256"]}}
                 for name, out in sorted(manifest["outputs"].items())]
    subjects.append({"name": manifest_name, "digest": {"sha256": manifest_sha256}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"image": manifest["image"], "config": manifest["config"],
                                       "sets": manifest["sets"]},
                "internalParameters": {"planKey": manifest["plan_key"], "kind": manifest["kind"],
                                       "sourceDateEpoch": manifest["source_date_epoch"],
                                       "imageDigest": manifest.get("image_digest")},
                "resolvedDependencies": _dependencies(manifest),
            },
            "runDetails": {
                "builder": {"id": builder_id(manifest["builder"]["version"])},
                "metadata": {"invocationId": f"{manifest['image']}@{manifest['plan_key']}"},
            },
        },
    }
