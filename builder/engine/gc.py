"""The engine's step cache, trimmed: `nodeforge gc` removes cache entries no build needs any more.

A cache entry is a tag in one of nodeforge's own repositories (nodeforge-cache[-NS]:<key> for the
steps, nodeforge-base[-NS]:<key> for the bases). One is removed when both hold:

- it was tagged longer ago than the age given (the engine's LastTagTime: when the step was built,
  or pulled from the fleet cache);
- no image tagged outside those repositories is it or builds on it. An output tag
  (nodeforge/gpu-node:0.1.0, a site build's tag, a user's own tag) keeps every step of its chain: a
  build of the same definitions stays a cache hit, and untagging a step an output still holds
  frees nothing anyway.

Untagged nodeforge images (an output whose tag a later build moved on) are pruned too; the engine
keeps any that another image builds on. No tag outside nodeforge's repositories is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import docker

from .. import paths
from ..errors import UsageError

_AGE = re.compile(r"(\d+)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(value: str) -> int:
    """--older-than: 30m, 12h, 7d, 0s -> seconds."""
    m = _AGE.fullmatch(value.strip())
    if not m:
        raise UsageError(f"--older-than {value!r}: expected a number and a unit (s, m, h or d), e.g. 7d or 12h")
    return int(m.group(1)) * _SECONDS[m.group(2)]


def cache_repos(all_namespaces: bool) -> tuple[str, ...] | None:
    """The repositories gc may untag: this namespace's two (NODEFORGE_CACHE_NAMESPACE), or None: every
    nodeforge-cache* and nodeforge-base* repository."""
    return None if all_namespaces else (paths.cache_repo(), paths.base_repo())


def is_cache_tag(tag: str, repos: tuple[str, ...] | None) -> bool:
    repo = tag.rsplit(":", 1)[0]
    if repos is not None:
        return repo in repos
    return any(repo == r or repo.startswith(r + "-") for r in (paths.CACHE_REPO, paths.BASE_REPO))


@dataclass(frozen=True)
class Entry:
    tag: str
    image_id: str
    tagged: datetime | None  # None: the engine does not say (an old engine, an image loaded from a tar)


@dataclass(frozen=True)
class Plan:
    remove: tuple[Entry, ...]
    in_use: int  # entries an image tagged outside the cache is, or builds on
    recent: int  # entries tagged within the age


def _tags(image: dict[str, Any]) -> list[str]:
    return [t for t in (image.get("RepoTags") or []) if t != "<none>:<none>"]


def _held(images: list[dict[str, Any]]) -> set[str]:
    """Ids of every image an output tag (one outside every cache repository) is or builds on."""
    parent = {str(i["Id"]): str(i.get("ParentId") or "") for i in images}
    held: set[str] = set()
    for i in images:
        if any(not is_cache_tag(t, None) for t in _tags(i)):
            cur = str(i["Id"])
            while cur and cur not in held:
                held.add(cur)
                cur = parent.get(cur, "")
    return held


def _tagged(c: docker.DockerClient, image_id: str) -> datetime | None:
    stamp = str((c.api.inspect_image(image_id).get("Metadata") or {}).get("LastTagTime") or "")
    if not stamp or stamp.startswith("0001-"):
        return None
    # the engine writes nanoseconds; Python reads microseconds
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(stamp)
    except ValueError:
        return None


def plan(c: docker.DockerClient, older_than_s: int, all_namespaces: bool = False) -> Plan:
    repos = cache_repos(all_namespaces)
    images = c.api.images(all=True)
    cache = [(t, str(i["Id"])) for i in images for t in _tags(i) if is_cache_tag(t, repos)]
    held = _held(images)
    now = datetime.now(UTC)
    stamps: dict[str, datetime | None] = {}  # one inspect per image, however many keys tag it
    remove, in_use, recent = [], 0, 0
    for tag, image_id in sorted(cache):
        if image_id in held:
            in_use += 1
            continue
        if image_id not in stamps:
            stamps[image_id] = _tagged(c, image_id)
        tagged = stamps[image_id]
        if tagged is not None and (now - tagged).total_seconds() < older_than_s:
            recent += 1
            continue
        remove.append(Entry(tag, image_id, tagged))
    return Plan(tuple(remove), in_use, recent)


def layers_size(c: docker.DockerClient) -> int:
    return int(c.df().get("LayersSize") or 0)


def apply(c: docker.DockerClient, p: Plan) -> None:
    """Untag each entry (the engine deletes an image left with no tag and no child; one another process
    removed first is gone already) and prune untagged nodeforge images."""
    for e in p.remove:
        try:
            c.api.remove_image(e.tag, noprune=False)
        except docker.errors.ImageNotFound:
            pass
    c.images.prune(filters={"dangling": True, "label": "io.nodeforge.image"})
