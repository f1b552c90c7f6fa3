"""`nodeforge mirror IMAGE... DIR`: exactly the locked packages of the images (and of the images
they build on) as .deb files, their locked wheels and their bases' mmdebstrap tarballs, with a flat
apt repository and the checksum index; written to DIR.tmp and renamed to DIR when complete."""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

from .. import lockfile
from ..compose.image import compose, lock_config
from ..debian import parse_dpkg_status
from ..definitions.load import Tree
from ..engine import bootstrap, offline
from ..engine import client as engine
from ..errors import BuildFailed, EnvironmentProblem, UsageError
from ..plan import BuildPlan, sha256_file
from ..progress import Progress, Timer
from . import download, repo
from .index import INDEX, Index

WHO = "mirror"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def closure(tree: Tree, images: list[str]) -> list[str]:
    """The images and those they build on, parents first."""
    order: list[str] = []

    def add(name: str) -> None:
        parent = tree.images[name].data["from"].get("image")
        if parent:
            add(parent)
        if name not in order:
            order.append(name)

    for i in images:
        add(tree.image(i).name)
    return order


def locks(tree: Tree, plans: list[BuildPlan]) -> dict[str, lockfile.Lock]:
    """image -> the lock of its (image, config) pair (images/NAME.lock, or images/NAME@CONFIG.lock
    for a config that changes the image)."""
    out = {}
    for plan in plans:
        owner = lock_config(plan)
        lock = lockfile.read(tree.root, plan.image, owner)
        if lock is None:
            raise UsageError(f"images/{lockfile.lock_name(plan.image, owner)}.lock: missing; a mirror holds "
                             f"exactly the locked packages: run `{lockfile.lock_command(plan.image, owner)}` first")
        out[plan.image] = lock
    return out


def base_packages(tar: Path) -> set[tuple[str, str]]:
    """(name, version) of every package installed in a base tarball (its dpkg status)."""
    with tarfile.open(tar) as t:
        for member in ("./var/lib/dpkg/status", "var/lib/dpkg/status"):
            try:
                f = t.extractfile(member)
            except KeyError:
                continue
            if f is not None:
                status = parse_dpkg_status(f.read().decode(errors="replace"))
                return {(fields["Package"], fields.get("Version", "")) for fields in status.values()}
    return set()


MARK = ".nodeforge-mirror-incomplete"  # in DIR.tmp while a mirror is written: what makes it ours to remove


def _ours(path: Path) -> bool:
    """path is a directory a mirror run made (DIR.tmp with its mark, DIR.old with an index) or absent."""
    if not path.exists() and not path.is_symlink():
        return True
    return path.is_dir() and not path.is_symlink() and ((path / MARK).is_file() or (path / INDEX).is_file())


def _prepare(dest: Path) -> Path:
    if dest.exists() and not (dest / INDEX).is_file():
        raise UsageError(f"{dest} exists and is not a nodeforge mirror; give a new directory")
    tmp, old = dest.with_name(dest.name + ".tmp"), dest.with_name(dest.name + ".old")
    for leftover in (tmp, old):
        if not _ours(leftover):
            raise UsageError(f"{leftover} exists and is not what an earlier `nodeforge mirror` left: move it away "
                             f"or give another directory than {dest}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    os.chmod(tmp, 0o755)
    (tmp / MARK).touch()
    return tmp


def _place(tmp: Path, dest: Path) -> None:
    (tmp / MARK).unlink()
    old = dest.with_name(dest.name + ".old")
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def _disk_full(e: OSError, tmp: Path, dest: Path) -> BuildFailed:
    """The message for a full disk while writing the mirror: the destination, what was written, the
    file being copied (shutil names the source in e.filename) and the space it needed."""
    written = sum(p.lstat().st_size for p in tmp.rglob("*") if p.is_file() and not p.is_symlink())
    src = Path(e.filename) if isinstance(e.filename, str) else None
    copying = src is not None and src.is_file() and tmp not in src.parents
    need = written + (src.stat().st_size if copying and src is not None else 0)
    free = shutil.disk_usage(tmp.parent).free
    what = f"copying {src.name} into it, " if copying and src is not None else ""
    return BuildFailed(f"mirror {dest}: no space left on the device of {dest.parent.resolve()} ({free / 1e6:.0f} MB "
                       f"free) after writing {written / 1e6:.0f} MB; {what}the mirror needs more than "
                       f"{need / 1e6:.0f} MB there. Nothing was left behind: free space in {dest.parent.resolve()} "
                       "or give a DIR on a larger disk, and run it again")


def mirror(tree: Tree, images: list[str], config: str | None, sets: list[Any], dest: Path,
           progress: Progress) -> Index:
    names = closure(tree, images)
    plans = [compose(tree, n, config, sets) for n in names]
    locked = locks(tree, plans)
    tmp = _prepare(dest)
    try:
        with Timer() as t:
            index = Index()
            for plan in plans:
                lock_file = lockfile.path_for(tree.root, plan.image, lock_config(plan))
                index.images[plan.image] = {"lock_sha256": sha256_file(lock_file), "base": plan.base.key}
            in_base = _bases(plans, tmp, index, progress)
            _debs(plans, locked, in_base, tmp, index, progress)
            _wheels(locked, tmp, index, progress)
            for rel in repo.write(tmp, _stanzas(tmp, index)):
                index.add_file(tmp, rel)
            index.write(tmp)
        _place(tmp, dest)
    except OSError as e:
        full = _disk_full(e, tmp, dest) if e.errno in DISK_FULL else None
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f["size"] for f in index.files.values())
    progress.say(WHO, f"{dest}: {len(index.files)} files, {size / 1e6:.0f} MB, index {INDEX} "
                 f"({t.seconds:.1f}s)")
    return index


def _bases(plans: list[BuildPlan], tmp: Path, index: Index, progress: Progress) -> dict[tuple[str, str], str]:
    """Each debian base's tarball into bases/; (name, version) installed in a base -> its key."""
    in_base: dict[tuple[str, str], str] = {}
    for plan in plans:
        if plan.base.kind != "debian" or plan.base.key in index.bases:
            continue
        src = bootstrap.tarball(plan.base, progress, plan.image)
        rel = f"bases/{plan.base.key}.tar"
        (tmp / "bases").mkdir(exist_ok=True)
        shutil.copyfile(src, tmp / rel)
        index.bases[plan.base.key] = rel
        index.add_file(tmp, rel)
        for pkg in base_packages(tmp / rel):
            in_base.setdefault(pkg, plan.base.key)
        progress.say(WHO, f"base {plan.base.key[:12]} of {plan.image}: {rel} "
                     f"({(tmp / rel).stat().st_size / 1e6:.0f} MB)")
    return in_base


def _wanted(plans: list[BuildPlan], locked: dict[str, lockfile.Lock]) -> dict[tuple[str, str], str]:
    """(name, version) of every locked package -> the first image and layer that locks it."""
    wanted: dict[tuple[str, str], str] = {}
    for plan in plans:
        for layer, entry in locked[plan.image].layers.items():
            for part in ("direct", "deps"):
                for name, version in entry[part].items():
                    wanted.setdefault((name, version), f"{plan.image}/{layer}")
    return wanted


def _debs(plans: list[BuildPlan], locked: dict[str, lockfile.Lock], in_base: dict[tuple[str, str], str],
          tmp: Path, index: Index, progress: Progress) -> None:
    wanted = _wanted(plans, locked)
    fetch = sorted(p for p in wanted if p not in in_base)
    for (name, version) in sorted(set(wanted) - set(fetch)):
        index.packages.setdefault(name, {})[version] = {"in_base": in_base[(name, version)]}
    progress.say(WHO, f"{len(wanted)} locked packages: {len(wanted) - len(fetch)} in the base, "
                 f"{len(fetch)} to download")
    if not fetch:
        return
    first = next((p for p in plans if p.base.kind == "debian"), None)
    if first is None:
        raise EnvironmentProblem("no image of these has a debian base to download packages on")
    c = engine.client()
    base_ref = bootstrap.ensure(c, first.base, progress, WHO)
    remedy = ("the lock is older than the archive: run `nodeforge lock " + " ".join(p.image for p in plans)
              + "` and build, then mirror again")
    with Timer() as t:
        files = download.debs(c, base_ref, plans, [f"{n}={v}" for n, v in fetch], tmp / "debs", remedy)
    checked = _record_debs(files, wanted, locked, tmp, index)
    progress.say(WHO, f"downloaded {len(files)} .deb files in {t.seconds:.1f}s; sha256 checked against "
                 f"the lock for {checked}, recorded from the download for {len(files) - checked} "
                 "(the lock predates `archives:`; apt checked them against the signed archive)")


def _record_debs(files: list[Path], wanted: dict[tuple[str, str], str], locked: dict[str, lockfile.Lock],
                 tmp: Path, index: Index) -> int:
    """Each .deb into the index, against the lock's sha256 where a lock has one; how many had one."""
    checked = 0
    for deb in files:
        f = repo.fields(repo.control(deb))
        name, version = f.get("Package", ""), f.get("Version", "")
        if (name, version) not in wanted:
            deb.unlink()  # apt-get download gave more than asked (never expected): not locked, not kept
            continue
        digest = sha256_file(deb)
        known = {a["sha256"] for lock in locked.values() for n, a in lock.archives.items()
                 if n == name and a.get("version") == version and a.get("sha256")}
        if known and digest not in known:
            raise EnvironmentProblem(f"{deb.name}: sha256 {digest} differs from the lock's "
                                     f"{', '.join(sorted(known))}: the archive served other bytes for "
                                     f"{name} {version}; do not use this mirror")
        checked += bool(known)
        # the pool's naming (no epoch): apt-get download's %3a would be read as a URL escape
        rel = f"debs/{name}_{version.split(':', 1)[-1]}_{f.get('Architecture', 'all')}.deb"
        os.replace(deb, tmp / rel)
        index.add_file(tmp, rel, digest)
        index.packages.setdefault(name, {})[version] = {"file": rel, "sha256_from": "lock" if known else "download"}
    missing = sorted(f"{n}={v} ({where})" for (n, v), where in wanted.items()
                     if v not in index.packages.get(n, {}))
    if missing:
        raise UsageError(f"no .deb came for {', '.join(missing)}; check the layers' repositories, "
                         "then mirror again")
    return checked


def _stanzas(tmp: Path, index: Index) -> list[str]:
    return [repo.stanza(repo.control(tmp / rel), rel, index.files[rel]["size"], index.files[rel]["sha256"])
            for rel in sorted(index.files) if rel.endswith(".deb")]


def _wheels(locked: dict[str, lockfile.Lock], tmp: Path, index: Index, progress: Progress) -> None:
    wheels = {(n, w["version"]): w for lock in locked.values() for ws in lock.wheels.values() for n, w in ws.items()}
    if not wheels:
        return
    with Timer() as t:
        for (name, version), w in sorted(wheels.items()):
            path = download.wheel(w["url"], w["sha256"], tmp / offline.WHEEL_DIR)
            rel = str(path.relative_to(tmp))
            index.add_file(tmp, rel, w["sha256"])
            index.wheels.setdefault(name, {})[version] = {"file": rel, "sha256": w["sha256"]}
    progress.say(WHO, f"downloaded {len(wheels)} wheels in {t.seconds:.1f}s, each checked against the lock's sha256")
