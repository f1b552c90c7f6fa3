"""build, lock and mirror: the commands that resolve and build."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from .. import done, lockfile
from ..compose.image import output_name
from ..compose.pairs import owners
from ..definitions.grammar import CACHE_REPOSITORY
from ..errors import UsageError
from ..fleetcache.cache import SharedCache
from ..fleetcache.registry import Location
from ..fleetcache.signature import PublicKey
from ..fleetcache.signature import SigningKey as CacheSigningKey
from ..mirror.gather import mirror as gather
from ..node.signing import Secrets, load_secrets
from ..paths import build_dir
from ..pipeline import Builder, check_locks
from ..progress import Progress
from .invocation import Invocation


def offline_mirror(offline: bool, mirror: str | None) -> Path | None:
    """The mirror directory of an offline build (None for a build with the network); exit 2 for
    --offline without --mirror and the other way round."""
    if offline and not mirror:
        raise UsageError("--offline needs --mirror DIR: a directory made by `nodeforge mirror IMAGE... DIR`")
    if mirror and not offline:
        raise UsageError("--mirror DIR is for offline builds: add --offline")
    return Path(mirror) if mirror else None


FLEET_CACHE = "NODEFORGE_FLEET_CACHE"  # REGISTRY/REPO, as --cache
FLEET_PUBLIC_KEY = "NODEFORGE_FLEET_PUBLIC_KEY"  # a path, as --cache-public-key
FLEET_SIGNING_KEY = "NODEFORGE_FLEET_SIGNING_KEY"  # a path, as --secret cache-signing=


def fleet_cache(inv: Invocation, secrets: Secrets, progress: Progress) -> SharedCache | None:
    """The fleet cache of this build: --cache, else $NODEFORGE_FLEET_CACHE, else the config's
    site.cache, else none (the keys likewise from their options, else the environment: what a
    matrix's batch jobs inherit); exit 2 for a value that is no REGISTRY/REPO or a key file that is
    not one."""
    a = inv.args
    config = inv.tree.config(inv.config) if inv.config else None
    value = a.cache or os.environ.get(FLEET_CACHE) or ((config.data.get("site") or {}).get("cache") if config else None)
    public_path = a.cache_public_key or os.environ.get(FLEET_PUBLIC_KEY)
    if secrets.cache_signing is None and os.environ.get(FLEET_SIGNING_KEY):
        secrets = dataclasses.replace(secrets, cache_signing=CacheSigningKey.load(Path(os.environ[FLEET_SIGNING_KEY])))
    if not value:
        if a.cache_public_key or a.cache_required or secrets.cache_signing:
            raise UsageError("--cache-public-key, --cache-required and --secret cache-signing are for a fleet cache: "
                             "give --cache REGISTRY/REPO or set site.cache in the config")
        return None
    pattern = CACHE_REPOSITORY.pattern or ""
    if not re.fullmatch(pattern, value) or len(value) > CACHE_REPOSITORY.max_len:
        raise UsageError(f"--cache {value!r}: expected {CACHE_REPOSITORY.what}, e.g. 127.0.0.1:5000/nodeforge-cache")
    public = PublicKey.load(Path(public_path)) if public_path else None
    if public is None:
        progress.say(a.images[0], f"cache {value}: no --cache-public-key, so nothing is pulled from it"
                     + ("; what is built is pushed" if secrets.cache_signing else ""))
    return SharedCache(Location.parse(value), progress, public, secrets.cache_signing, a.cache_required)


def build_with_engine(inv: Invocation, chosen: list[str] | None,
                      record_key: str | Callable[[], str | None] | None = None) -> int:
    """The pipeline; chosen: --format, checked (commands.building); record_key: the done record this
    build writes when it ends (a callable: computed then, from what the build resolved)."""
    a = inv.args
    secrets = load_secrets(a.secret or [])  # checked before anything is built, before the tree is read
    tree = inv.tree
    with Progress(quiet=a.quiet, live=True) as progress:  # live status on a terminal, plain lines in logs
        cache = fleet_cache(inv, secrets, progress)
        builder = Builder(tree, inv.config, inv.sets, progress, locked=a.locked, secrets=secrets,
                          formats=chosen, mirror=offline_mirror(a.offline, a.mirror), cache=cache)
        results = builder.build(a.images, jobs=a.jobs)
        if cache is not None:
            f = cache.figures
            progress.say(a.images[-1], f"cache {cache.location}: {f.pulled} pulled ({f.bytes_pulled / 1e6:.1f} MB), "
                         f"{f.pushed} pushed ({f.bytes_pushed / 1e6:.1f} MB), {len(f.refused)} refused")
    summary = ["images:"]
    for r in results:
        summary.append(f"  {r.image:<20} {' '.join(r.tags):<40} {r.id[7:19]}  {r.size / 1e6:8.1f} MB")
        if r.node:
            for role in r.node.files:
                path = r.node.path(role)
                summary.append(f"    {role:<8} {path}  ({path.stat().st_size / 1e6:.1f} MB)")
    print("\n".join(summary))
    if callable(record_key):
        record_key = record_key()
    if record_key is not None:  # the next build of the same inputs answers from this
        done.write(tree.root, record_key, {t: r.id for r in results for t in r.tags},
                   [build_dir(tree.root) / "images" / output_name(r.plan) for r in results], summary)
    return 0


def lock(inv: Invocation) -> int:
    if inv.args.all:
        if inv.args.image or inv.config:
            raise UsageError("lock --all: every image and config of the tree; give no IMAGE and no -c")
        return lock_check_all(inv) if inv.args.check else lock_all(inv)
    if not inv.args.image:
        raise UsageError("lock: give an IMAGE (with -c CONFIG for a config's lock), or --all")
    tree = inv.tree
    name = inv.image_name()
    current, fresh = Builder(tree, inv.config, inv.sets, Progress()).resolve_lock(name)
    changes = lockfile.diff(current, fresh)
    if inv.args.check:
        # per package: old -> new version and whether the new one is a security update; and what the
        # image's pins hold below a security update
        if drifted := lockfile.drift(current, fresh):
            print("\n".join(drifted))
            return 1
        print(f"{name}: lock is current")
        return 0
    path = lockfile.write(tree.root, fresh)
    print("\n".join(changes) if changes else "no changes")
    print(f"wrote {path.relative_to(tree.root)}")
    return 0


def lock_all(inv: Invocation) -> int:
    """One lock file per (image, config) pair that owns one (compose.pairs.owners), each resolved afresh."""
    for name, pair in owners(inv.tree).items():
        current, fresh = Builder(inv.tree, pair.config, inv.sets, Progress()).resolve_lock(pair.image)
        changes = lockfile.diff(current, fresh)
        path = lockfile.write(inv.tree.root, fresh)
        print(f"{name}: {len(changes)} change(s); wrote {path.relative_to(inv.tree.root)}" if changes
              else f"{name}: no changes")
    return 0


def lock_check_all(inv: Invocation) -> int:
    drifted = False
    for name, lines in check_locks(inv.tree, Progress(), inv.sets).items():
        drifted |= bool(lines)
        print("\n".join([f"{name}: lock is not current", *lines]) if lines else f"{name}: lock is current")
    return 1 if drifted else 0


def mirror(inv: Invocation) -> int:
    images, target = inv.args.images[:-1], inv.args.images[-1]
    if not images:
        raise UsageError("mirror: give one or more images and then the directory: nodeforge mirror IMAGE... DIR")
    with Progress(quiet=inv.args.quiet) as progress:
        index = gather(inv.tree, images, inv.config, inv.sets, Path(target), progress)
    debs = sum(1 for v in index.packages.values() for e in v.values() if "file" in e)
    print(f"{target}: {debs} packages, {sum(len(v) for v in index.wheels.values())} wheels, "
          f"{len(index.bases)} base(s) for {', '.join(sorted(index.images))}; build with: nodeforge build --offline "
          f"--mirror {target} IMAGE")
    return 0


def gc(inv: Invocation) -> int:
    from ..engine import gc as trim

    p = trim.plan(inv.client, trim.parse_age(inv.args.older_than), inv.args.all_namespaces)
    for e in p.remove:
        when = e.tagged.strftime("%Y-%m-%d %H:%M") if e.tagged else "unknown"
        print(f"{'would remove' if inv.args.dry_run else 'remove'} {e.tag} (tagged {when})")
    kept = f"kept {p.in_use} an output tag builds on and {p.recent} newer than {inv.args.older_than}"
    if inv.args.dry_run:
        print(f"gc: {len(p.remove)} cache entries would go; {kept}")
        return 0
    before = trim.layers_size(inv.client)
    trim.apply(inv.client, p)
    freed = max(0, before - trim.layers_size(inv.client))
    print(f"gc: removed {len(p.remove)} cache entries, freed {freed / 1e9:.1f} GB; {kept}")
    return 0
