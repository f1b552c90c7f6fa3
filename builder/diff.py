"""`nodeforge diff A B`: what changed between two built images, the question every rollout
review asks. Reads both file systems and configs from the engine; runs nothing in them."""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors

from .debian import parse_dpkg_status
from .engine import client as engine
from .engine.client import SESSION_LABEL
from .errors import EnvironmentProblem

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

    def packages(self) -> dict[str, str]:
        status = parse_dpkg_status(self.texts.get("var/lib/dpkg/status", ""))
        return {k: v.get("Version", "") for k, v in status.items()}

    def sysctl(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for path in sorted(p for p in self.texts if re.match(r"(etc|usr/lib)/sysctl\.d/.*\.conf$", p)):
            for line in self.texts[path].splitlines():
                line = line.strip()
                if line and not line.startswith(("#", ";")) and "=" in line:
                    k, _, v = line.partition("=")
                    out[k.strip()] = " ".join(v.split())
        return out

    def kernel_args(self) -> list[str]:
        args: list[str] = []
        for path in sorted(p for p in self.texts if p.startswith("etc/nodeforge/kernel-cmdline.d/")):
            args += [a for line in self.texts[path].splitlines() if not line.startswith("#") for a in line.split()]
        return args

    def services(self) -> set[str]:
        return {p.split("/", 3)[-1] for p in self.files if re.match(r"etc/systemd/system/[^/]+\.wants/", p)}

    def modprobe(self) -> list[str]:
        lines: list[str] = []
        for path in sorted(p for p in self.texts if re.match(r"etc/modprobe\.d/.*\.conf$", p)):
            lines += [f"{line.strip()}" for line in self.texts[path].splitlines()
                      if line.strip() and not line.startswith("#")]
        return lines


def _keep_text(path: str) -> bool:
    return path == "var/lib/dpkg/status" or bool(re.match(
        r"(etc|usr/lib)/sysctl\.d/|etc/nodeforge/kernel-cmdline\.d/|etc/modprobe\.d/", path))


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
    lines = []
    for k in sorted(set(a) | set(b)):
        if k not in b:
            lines.append(f"  - {k} {a[k]}")
        elif k not in a:
            lines.append(f"  + {k} {b[k]}")
        elif a[k] != b[k]:
            lines.append(f"  ~ {k} {a[k]} -> {b[k]}")
    return [f"{title}:", *lines] if lines else []


def _set_diff(title: str, a: list[str] | set[str], b: list[str] | set[str]) -> list[str]:
    lines = [f"  - {x}" for x in sorted(set(a) - set(b))] + [f"  + {x}" for x in sorted(set(b) - set(a))]
    return [f"{title}:", *lines] if lines else []


def diff(c: docker.DockerClient, ref_a: str, ref_b: str, all_files: bool = False) -> list[str]:
    a, b = snapshot(c, ref_a), snapshot(c, ref_b)
    volatile = ("org.opencontainers.image.revision",)
    out = [f"--- {ref_a} ({a.id[7:19]})", f"+++ {ref_b} ({b.id[7:19]})"]
    out += _map_diff("packages", a.packages(), b.packages())
    out += _map_diff("sysctl", a.sysctl(), b.sysctl())
    out += _set_diff("kernel arguments", a.kernel_args(), b.kernel_args())
    out += _set_diff("module options and blacklist", a.modprobe(), b.modprobe())
    out += _set_diff("services enabled", a.services(), b.services())
    out += _map_diff("env", a.env, b.env)
    out += _map_diff("labels", {k: v for k, v in a.labels.items() if k not in volatile},
                     {k: v for k, v in b.labels.items() if k not in volatile})
    fa = {k: "/".join(v) for k, v in a.files.items()}
    fb = {k: "/".join(v) for k, v in b.files.items()}
    files = [line for line in _map_diff("files", fa, fb)[1:]]
    if files:
        shown = files if all_files else [ln for ln in files if re.match(r"  . (etc|usr/lib/nodeforge|usr/local)/", ln)]
        out.append(f"files: {len(files)} changed" + ("" if all_files else f" ({len(shown)} under /etc, "
                                                      "/usr/local and /usr/lib/nodeforge shown; --all for every one)"))
        out += [re.sub(r" ([0-7]{4}|link)/(\S{12})\S*", r" \1/\2", ln) for ln in shown]
    return out
