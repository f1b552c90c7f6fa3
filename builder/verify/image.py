"""Image-scope checks: read the image's config and files through the engine, run nothing. The file
check gathers FileFacts from the image's archive and hands them to the shared judge."""

from __future__ import annotations

import hashlib
import io
import re
import stat
import tarfile
from typing import Any

import docker
import docker.errors

from ..debian import parse_dpkg_status
from ..engine import client as engine
from ..engine.client import SESSION_LABEL
from .judges import FileFacts, judge_file


class ImageView:
    def __init__(self, c: docker.DockerClient, ref: str) -> None:
        self.c, self.ref = c, ref
        self.attrs = engine.inspect(c, ref)
        self.container = c.containers.create(ref, command=["/bin/true"], entrypoint=[],
                                             labels={SESSION_LABEL: "image-view"})
        self._passwd: dict[str, str] | None = None
        self._groups: dict[str, str] | None = None
        self._dpkg: dict[str, dict[str, str]] | None = None

    def close(self) -> None:
        try:
            self.container.remove(force=True)
        except docker.errors.APIError:
            pass

    def member(self, path: str) -> tuple[tarfile.TarInfo, bytes] | None:
        try:
            stream, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return None
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            first = tar.next()
            if first is None:
                return None
            content = b""
            if first.isfile():
                f = tar.extractfile(first)
                content = f.read() if f else b""
            return first, content

    def read(self, path: str) -> str:
        m = self.member(path)
        return m[1].decode(errors="replace") if m else ""

    def names(self, path: str) -> list[str]:
        try:
            stream, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return []
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            return tar.getnames()

    def _ids(self, path: str) -> dict[str, str]:
        out = {}
        for line in self.read(path).splitlines():
            parts = line.split(":")
            if len(parts) > 2:
                out[parts[2]] = parts[0]
        return out

    def user(self, uid: int) -> str:
        if self._passwd is None:
            self._passwd = self._ids("/etc/passwd")
        return self._passwd.get(str(uid), str(uid))

    def group(self, gid: int) -> str:
        if self._groups is None:
            self._groups = self._ids("/etc/group")
        return self._groups.get(str(gid), str(gid))

    def dpkg(self) -> dict[str, dict[str, str]]:
        if self._dpkg is None:
            self._dpkg = parse_dpkg_status(self.read("/var/lib/dpkg/status"))
        return self._dpkg

    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.attrs["Config"].get("Env") or [])

    def labels(self) -> dict[str, str]:
        return self.attrs["Config"].get("Labels") or {}


def file_facts(view: ImageView, path: str) -> FileFacts:
    """The facts of a path in the image, from the engine's archive of it."""
    m = view.member(path)
    if m is None:
        return FileFacts(False)
    info, content = m
    kind = "file" if info.isfile() else "directory" if info.isdir() else "symlink" if info.issym() else "other"
    return FileFacts(True, kind, stat.S_IMODE(info.mode), (view.user(info.uid), str(info.uid)),
                     (view.group(info.gid), str(info.gid)), info.linkname,
                     hashlib.sha256(content).hexdigest() if info.isfile() else "", content.decode(errors="replace"))


def check_file(view: ImageView, spec: dict[str, Any]) -> str:
    return judge_file(spec, file_facts(view, spec["path"]))


def check_package(view: ImageView, spec: dict[str, Any]) -> str:
    pkg = view.dpkg().get(spec["name"])
    if not spec.get("installed", True):
        return f"{spec['name']} is installed ({pkg['Version']})" if pkg else ""
    if pkg is None:
        return f"{spec['name']} is not installed (dpkg)"
    if spec.get("version") and pkg.get("Version") != spec["version"]:
        return f"{spec['name']} is {pkg.get('Version')}, expected {spec['version']}"
    return ""


def check_env(view: ImageView, spec: dict[str, Any]) -> str:
    env = view.env()
    name = spec["name"]
    if spec.get("absent"):
        return f"{name} is set to {env[name]!r}" if name in env else ""
    if name not in env:
        return f"{name} is not set"
    if spec.get("value") is not None and env[name] != spec["value"]:
        return f"{name} is {env[name]!r}, expected {spec['value']!r}"
    if spec.get("contains") and spec["contains"] not in env[name]:
        return f"{name} is {env[name]!r}, which does not contain {spec['contains']!r}"
    return ""


def check_label(view: ImageView, spec: dict[str, Any]) -> str:
    labels = view.labels()
    name = spec["name"]
    if name not in labels:
        return f"label {name} is not set"
    if spec.get("value") is not None and labels[name] != spec["value"]:
        return f"label {name} is {labels[name]!r}, expected {spec['value']!r}"
    if spec.get("matches") and not re.search(spec["matches"], labels[name]):
        return f"label {name} is {labels[name]!r}, which does not match {spec['matches']!r}"
    return ""


def check_service(view: ImageView, spec: dict[str, Any]) -> str:
    if spec.get("enabled") is None:
        return ""
    wants = [n for n in view.names("/etc/systemd/system") if re.search(r"\.(wants|requires)/" +
                                                                       re.escape(spec["name"]) + "$", n)]
    if spec["enabled"] and not wants:
        return f"{spec['name']} is not enabled (no .wants/ link under /etc/systemd/system)"
    if not spec["enabled"] and wants:
        return f"{spec['name']} is enabled ({wants[0]})"
    return ""


IMAGE_CHECKS = {"file": check_file, "package": check_package, "env": check_env, "label": check_label,
                "service": check_service}
