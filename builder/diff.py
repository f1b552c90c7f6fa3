"""`nodeforge diff A B`: what changed between two built images, the question every rollout
review asks. Reads both file systems and configs from the engine; runs nothing in them.
Two rollout manifests (paths ending in .json) are compared without the engine."""

from __future__ import annotations

import hashlib
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from .compose.contributions import KINDS
from .engine import client as engine
from .engine.client import SESSION_LABEL
from .engine.recorded import recorded
from .errors import EnvironmentProblem, UsageError
from .escaping import for_markdown_text, for_terminal
from .manifest import compare, history
from .manifest import document as manifest

# churn that says nothing about what a node runs
_IGNORED = re.compile(r"^(var/lib/dpkg/|var/log/|var/cache/|var/lib/apt/|etc/ld\.so\.cache$|usr/lib/nodeforge/layers/)")


@dataclass
class Snapshot:
    ref: str
    id: str
    env: dict[str, str]
    labels: dict[str, str]
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (mode/type, sha256 or link)
    texts: dict[str, str] = field(default_factory=dict)  # configuration files kept whole


def _keep_text(path: str) -> bool:
    return any(k.diff is not None and re.match(k.diff.keep, path) for k in KINDS)


def snapshot(c: docker.DockerClient, ref: str) -> Snapshot:
    try:
        attrs = engine.inspect(c, ref)
    except docker.errors.ImageNotFound:
        raise EnvironmentProblem(f"no image {ref!r} in the engine; build it first or give a tag or id") from None
    cfg = attrs["Config"]
    snap = Snapshot(ref, attrs["Id"], dict(e.split("=", 1) for e in cfg.get("Env") or []), cfg.get("Labels") or {})
    container = c.containers.create(ref, command=["/bin/true"], entrypoint=[], labels={SESSION_LABEL: "diff"})
    try:
        stream = container.export()
        with tarfile.open(fileobj=_Reader(stream), mode="r|") as tar:  # type: ignore[call-overload]
            for m in tar:
                path = m.name.lstrip("./")
                if not path or (_IGNORED.match(path) and path != "var/lib/dpkg/status"):
                    continue
                if m.isfile():
                    f = tar.extractfile(m)
                    data = f.read() if f else b""
                    snap.files[path] = (f"{m.mode & 0o7777:04o}", hashlib.sha256(data).hexdigest())
                    if _keep_text(path):
                        snap.texts[path] = data.decode(errors="replace")
                elif m.issym():
                    snap.files[path] = ("link", m.linkname)
                elif m.isdir():
                    continue
    finally:
        container.remove(force=True)
    return snap


class _Reader:
    """A file-like view of the engine's export stream, for tarfile's streaming mode."""

    def __init__(self, chunks: Any) -> None:
        self.chunks = iter(chunks)
        self.buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            try:
                self.buf += next(self.chunks)
            except StopIteration:
                break
        if n < 0:
            data, self.buf = self.buf, b""
        else:
            data, self.buf = self.buf[:n], self.buf[n:]
        return data


def _map_diff(title: str, a: dict[str, str], b: dict[str, str]) -> list[str]:
    """What the image holds (paths, values) is shown escaped: one printable line each."""
    t = for_terminal
    lines = []
    for k in sorted(set(a) | set(b)):
        if k not in b:
            lines.append(f"  - {t(k)} {t(a[k])}")
        elif k not in a:
            lines.append(f"  + {t(k)} {t(b[k])}")
        elif a[k] != b[k]:
            lines.append(f"  ~ {t(k)} {t(a[k])} -> {t(b[k])}")
    return [f"{title}:", *lines] if lines else []


def _set_diff(title: str, a: list[str] | set[str], b: list[str] | set[str]) -> list[str]:
    lines = [f"  - {for_terminal(x)}" for x in sorted(set(a) - set(b))]
    lines += [f"  + {for_terminal(x)}" for x in sorted(set(b) - set(a))]
    return [f"{title}:", *lines] if lines else []


def _built_from(labels: dict[str, str]) -> str:
    """What the build recorded: plan key, config and --set values (empty for other images)."""
    rec = recorded(labels)
    if rec is None:
        return ""
    flags = shlex.join(rec.flags())
    return f"; plan {rec.key[:12]}" + (f", built with {flags}" if flags else "")


def _header(ref: str, snap: Snapshot) -> str:
    return for_terminal(f"{ref} ({snap.id[7:19]}{_built_from(snap.labels)})")


def diff(c: docker.DockerClient, ref_a: str, ref_b: str, all_files: bool = False) -> list[str]:
    a, b = snapshot(c, ref_a), snapshot(c, ref_b)
    out = [f"--- {_header(ref_a, a)}", f"+++ {_header(ref_b, b)}"]
    for kind in KINDS:  # every contribution kind that can be read back from a built image
        if kind.diff is None:
            continue
        va, vb = kind.diff.extract(a), kind.diff.extract(b)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _map_diff(kind.diff.title, va, vb)
        else:
            out += _set_diff(kind.diff.title, set(va), set(vb))
    fa = {k: "/".join(v) for k, v in a.files.items()}
    fb = {k: "/".join(v) for k, v in b.files.items()}
    files = [line for line in _map_diff("files", fa, fb)[1:]]
    if files:
        shown = files if all_files else [ln for ln in files if re.match(_SHOWN, ln[4:])]
        out.append(f"files: {len(files)} changed" + ("" if all_files else f" ({len(shown)} under /etc, "
                                                      "/usr/local and /usr/lib/nodeforge shown; --all for every one)"))
        out += [re.sub(r" ([0-7]{4}|link)/(\S{12})\S*", r" \1/\2", ln) for ln in shown]
    return out


_SHOWN = r"(etc|usr/lib/nodeforge|usr/local)/"


def _short_file(value: tuple[str, str]) -> str:
    return f"{value[0]}/{value[1][:12]}"


def diff_markdown(c: docker.DockerClient, ref_a: str, ref_b: str,
                  all_files: bool = False) -> tuple[list[str], bool]:
    """The same comparison as a review-ready Markdown summary; (lines, whether anything changed)."""
    a, b = snapshot(c, ref_a), snapshot(c, ref_b)
    sections = []
    for kind in KINDS:
        if kind.diff is None:
            continue
        va, vb = kind.diff.extract(a), kind.diff.extract(b)
        if isinstance(va, dict) and isinstance(vb, dict):
            sections.append(compare.keyed(kind.diff.title, va, vb))
        else:
            sections.append(compare.unordered(kind.diff.title, set(va), set(vb)))
    keep = (lambda path: True) if all_files else (lambda path: bool(re.match(_SHOWN, path)))
    sections.append(compare.keyed("files" if all_files else "files under /etc, /usr/local and /usr/lib/nodeforge",
                                  {k: _short_file(v) for k, v in a.files.items() if keep(k)},
                                  {k: _short_file(v) for k, v in b.files.items() if keep(k)}))
    facts = [("image", ref_a, ref_b), ("engine id", a.id[7:19], b.id[7:19]),
             ("built from", _built_from(a.labels).lstrip("; "), _built_from(b.labels).lstrip("; "))]
    title = f"Rollout review: {for_markdown_text(ref_a)} → {for_markdown_text(ref_b)}"
    return compare.markdown(title, facts, sections), compare.changed(sections)


def is_manifest(arg: str) -> bool:
    return arg.endswith(".json")


def diff_manifests(path_a: str, path_b: str, fmt: str = "text") -> tuple[list[str], bool]:
    """Two rollout manifests compared without the engine; (lines, whether anything changed)."""
    a, b = (manifest.load(Path(path)) for path in (path_a, path_b))  # a UsageError names file and key
    sections = compare.compare(a, b)
    if fmt == "markdown":
        return compare.markdown_for(path_a, path_b, a, b), compare.changed(sections)
    return compare.text(compare.describe(path_a, a), compare.describe(path_b, b), sections), compare.changed(sections)


def diff_previous(image_dir: Path, fmt: str = "text") -> tuple[list[str], bool]:
    """`nodeforge diff IMAGE --previous`: the image's manifest against the one of the build before
    it (kept in `<image_dir>/history/` by every build); (lines, whether anything changed)."""
    current = image_dir / manifest.NAME
    if not current.is_file():
        raise UsageError(f"no manifest at {current}: build the image first")
    previous = history.previous(image_dir)
    if previous is None:
        raise UsageError(f"no previous build of this image is kept in {image_dir / history.DIR}: "
                         "`--previous` compares a build with the one before it; build it again after a change")
    return diff_manifests(str(previous), str(current), fmt)


def report(a: str, b: str, fmt: str = "text", all_files: bool = False) -> tuple[list[str], bool]:
    """`nodeforge diff A B`: two manifests (paths ending in .json, no engine needed) or two built
    images, as text or Markdown; (lines, whether anything changed)."""
    if is_manifest(a) or is_manifest(b):
        if not (is_manifest(a) and is_manifest(b)):
            raise UsageError(f"diff compares two manifests (paths ending in .json) or two built images, not one of "
                             f"each: {a} {b}")
        return diff_manifests(a, b, fmt)
    c = engine.client()
    if fmt == "markdown":
        return diff_markdown(c, a, b, all_files)
    lines = diff(c, a, b, all_files)
    return lines, len(lines) > 2
