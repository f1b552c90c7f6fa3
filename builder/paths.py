"""Where a build keeps its files and which engine repositories it tags: both can be moved, so that
two builds share nothing of ours (a reproducibility check builds twice this way).

NODEFORGE_BUILD_DIR      the build directory (default <project>/build)
NODEFORGE_CACHE_NAMESPACE a suffix for the engine repositories (default none): with `ns`, steps are
                          tagged nodeforge-cache-ns:<key> and bases nodeforge-base-ns:<key>

Both are read at call time, never at import time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import EnvironmentProblem

BUILD_DIR_VARIABLE = "NODEFORGE_BUILD_DIR"
NAMESPACE_VARIABLE = "NODEFORGE_CACHE_NAMESPACE"
CACHE_REPO = "nodeforge-cache"
BASE_REPO = "nodeforge-base"
_NAMESPACE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


def build_dir(root: Path) -> Path:
    value = os.environ.get(BUILD_DIR_VARIABLE, "")
    return Path(value).absolute() if value else root / "build"


def namespace() -> str:
    value = os.environ.get(NAMESPACE_VARIABLE, "")
    if value and (len(value) > 64 or not _NAMESPACE.fullmatch(value)):
        raise EnvironmentProblem(f"{NAMESPACE_VARIABLE}={value!r} is not usable in an engine repository name; "
                           "use lower-case letters, digits and single . _ - between them (at most 64)")
    return value


def _namespaced(repo: str) -> str:
    ns = namespace()
    return f"{repo}-{ns}" if ns else repo


def cache_repo() -> str:
    return _namespaced(CACHE_REPO)


def base_repo() -> str:
    return _namespaced(BASE_REPO)
