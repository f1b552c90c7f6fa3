"""The OCI labels every image carries: created, revision, source, version, base and layer keys."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from ..lockfile import redact_url
from ..plan import BuildPlan

KEY_LABEL = "io.nodeforge.key"  # the plan key the image was built from
CONFIG_LABEL = "io.nodeforge.config"  # with SETS_LABEL: the flags that recompose that plan
SETS_LABEL = "io.nodeforge.sets"  # the --set arguments, a JSON list
ROLE_LABEL = "io.nodeforge.role"  # on a throwaway container: what it is for (export, assembly, lock, mirror, ...)


def git_revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def git_source(root: Path) -> str:
    try:
        url = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"], capture_output=True,
                             text=True, check=True).stdout.strip()
        return redact_url(url) or "local"  # never a credential: a token in the origin is published with the image
    except (OSError, subprocess.CalledProcessError):
        return "local"


def oci_labels(plan: BuildPlan, root: Path, base_name: str, base_digest: str) -> dict[str, str]:
    created = datetime.fromtimestamp(plan.base.epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    layers = [{"name": s.layer, "key": s.key} for s in plan.steps]
    return {
        **plan.labels,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.revision": git_revision(root),
        "org.opencontainers.image.source": git_source(root),
        "org.opencontainers.image.version": plan.version,
        "org.opencontainers.image.title": plan.image,
        "org.opencontainers.image.description": plan.summary,
        "org.opencontainers.image.base.name": base_name,
        "org.opencontainers.image.base.digest": base_digest,
        "io.nodeforge.image": plan.image,
        "io.nodeforge.kind": plan.kind,
        CONFIG_LABEL: plan.config or "",
        SETS_LABEL: json.dumps(list(plan.sets)),
        KEY_LABEL: plan.key,
        "io.nodeforge.layers": json.dumps(layers, separators=(",", ":")),
    }
