"""Package resolution for the lock: simulate each layer's installs on the image's real base,
layer by layer, in one throwaway container."""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
from pathlib import Path

import docker

from .. import resources
from ..debversion import newer
from ..errors import BuildFailed
from ..lockfile import Lock, wheel_name
from ..plan import BuildPlan
from ..progress import Progress, Timer
from .client import END_MARK, finished_output
from .labels import ROLE_LABEL
from .trust import extra_ca

_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+)")
# the release list and architecture of an Inst line: "(1.2-3 Debian:12.15/oldstable, Debian-Security:... [amd64])"
_INST_ORIGIN = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\(\S+ ?(.*?) ?\[([^\]]+)\]\)")
_MARK = "@@nodeforge-layer "
_ARCHIVES = "@@nodeforge-archives"
_SEEN = "/tmp/nodeforge-resolved"
_SECURITY = "@@nodeforge-security"
# name=version of every package simulated or already there, then apt's record of that .deb
_ARCHIVE_SCRIPT = (f"echo {_ARCHIVES}\n"
                   "sed -nE 's/^Inst ([^ ]+) (\\[[^]]*\\] )?\\(([^ ]+).*/\\1=\\3/p; "
                   "s/^Have ([^ ]+) ([^ ]+)$/\\1=\\2/p' "
                   f"{_SEEN} 2>/dev/null | sort -u | xargs -r apt-cache show 2>/dev/null "
                   "| grep -E '^(Package|Version|Architecture|SHA256):' || true")
# every version of those packages that a security archive offers (apt-cache madison: "name | version |
# URI suite-security/component arch Packages"), whether or not a pin lets apt take it
_SECURITY_SCRIPT = (f"echo {_SECURITY}\n"
                    "sed -nE 's/^(Inst|Have) ([^ ]+) .*/\\2/p' "
                    f"{_SEEN} 2>/dev/null | sort -u | xargs -r apt-cache madison 2>/dev/null "
                    "| awk -F'|' '$3 ~ /-security\\// { gsub(/ /, \"\", $1); gsub(/ /, \"\", $2); print $1, $2 }' "
                    "|| true")


def _script(plan: BuildPlan) -> str:
    lines = ["set -e", "export DEBIAN_FRONTEND=noninteractive", "apt-get update -q >&2"]
    cumulative: list[str] = []
    for step in plan.steps:
        names = [p.partition("=")[0] for p in step.packages]
        cumulative += names
        lines.append(f"echo {shlex.quote(_MARK + step.layer)}")
        if cumulative:
            pkgs = " ".join(shlex.quote(p) for p in cumulative)
            keep = f"tee -a {_SEEN}"
            lines.append(f"apt-get install -s -q --no-install-recommends {pkgs} | grep '^Inst ' | {keep} || true")
            lines.append(f"dpkg-query -W -f='Have ${{Package}} ${{Version}}\\n' {pkgs} 2>/dev/null | {keep} || true")
    lines.append(_ARCHIVE_SCRIPT)
    lines.append(_SECURITY_SCRIPT)
    lines.append(f"echo {END_MARK}")
    return "\n".join(lines) + "\n"


def repo_files(plan: BuildPlan) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for step in plan.steps:
            for f in step.files:
                if f.path.startswith(("/etc/apt/", "/usr/share/keyrings/")):
                    data = f.content.encode() if f.content is not None else Path(f.source or "").read_bytes()
                    info = tarfile.TarInfo(f.path.lstrip("/"))
                    info.size, info.mode = len(data), int(f.mode, 8)
                    tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def resolve(c: docker.DockerClient, plan: BuildPlan, base_ref: str, progress: Progress) -> Lock:
    with Timer() as t:
        container = c.containers.create(base_ref, ["bash", "-c", _script(plan)], labels={ROLE_LABEL: "lock"})
        try:
            container.put_archive("/", repo_files(plan))
            container.start()
            status = container.wait(timeout=900)
            if status.get("StatusCode", 1) != 0:
                err = container.logs(stdout=False, stderr=True).decode(errors="replace")
                raise BuildFailed(f"package resolution for {plan.image} failed:\n"
                                  + "\n".join(err.splitlines()[-15:]))
            stdout = finished_output(container, f"package resolution for {plan.image}")
        finally:
            container.remove(force=True)
    layers: dict[str, dict[str, dict[str, str]]] = {}
    seen: dict[str, str] = {}
    current = None
    per_layer: dict[str, dict[str, str]] = {}
    have: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK):]
            per_layer[current], have[current] = {}, {}
        elif current and (m := _INST.match(line)):
            per_layer[current][m.group(1)] = m.group(2)
        elif current and line.startswith("Have "):
            _, pkg, ver = line.split(" ", 2)
            have[current][pkg] = ver
    for step in plan.steps:
        names = [p.partition("=")[0] for p in step.packages]
        sim = per_layer.get(step.layer, {})
        new = {k: v for k, v in sim.items() if k not in seen}
        direct = {}
        for n in names:
            v = sim.get(n) or seen.get(n) or have.get(step.layer, {}).get(n)
            if v is None:
                raise BuildFailed(f"package {n!r} of layer {step.layer!r} did not resolve on {base_ref}; "
                                  "check the name and the layer's repositories")
            direct[n] = v
        layers[step.layer] = {"direct": direct, "deps": {k: v for k, v in new.items() if k not in direct}}
        seen.update(new)
    progress.say(plan.image, f"resolved {len(seen)} packages in {t.seconds:.1f}s")
    locked = {p for e in layers.values() for part in e.values() for p in part.items()}
    stdout, _, offered = stdout.partition(_SECURITY)
    return Lock(plan.image, plan.base.key, layers, resolve_wheels(c, plan, base_ref, progress),
                archives(stdout, locked), security=security_versions(offered))


def archives(stdout: str, locked: set[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """package -> {version, architecture, sha256, origin} of each locked (package, version): the
    origin from apt's Inst line, the rest from `apt-cache show`; only what apt said."""
    found: dict[str, dict[str, str]] = {}
    head, _, records = stdout.partition(_ARCHIVES)
    for line in head.splitlines():
        if m := _INST_ORIGIN.match(line):
            found.setdefault(m.group(1), {})["origin"] = m.group(2).strip()
    for record in records.split("Package: ")[1:]:
        fields = dict(x.split(": ", 1) for x in ("Package: " + record).splitlines() if ": " in x)
        name, version = fields.get("Package", ""), fields.get("Version", "")
        if (name, version) in locked and "SHA256" in fields:
            found.setdefault(name, {}).update(version=version, architecture=fields.get("Architecture", ""),
                                              sha256=fields["SHA256"])
    return {n: a for n, a in sorted(found.items()) if "version" in a}


def security_versions(text: str) -> dict[str, str]:
    """package -> the newest version a security archive offers (from the madison lines)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, _, version = line.strip().partition(" ")
        if name and version and " " not in version and (name not in found or newer(version, found[name])):
            found[name] = version
    return found


# --- wheels ---------------------------------------------------------------------------------------
# In a throwaway container of the image's own base (its Python, its glibc): pip resolves each layer's
# requirements, cumulatively and constrained by the wheels already in the base and in earlier
# layers, and reports the exact version, URL and sha256 of every wheel file. pip stays out of the image.



def resolve_wheels(c: docker.DockerClient, plan: BuildPlan, base_ref: str,
                   progress: Progress) -> dict[str, dict[str, dict[str, str]]]:
    """layer -> wheel name -> {version, url, sha256, direct} for every layer with packages.pip."""
    wanted = [(s.layer, list(s.wheels)) for s in plan.steps if s.wheels]
    if not wanted:
        return {}
    ca = extra_ca()
    script = resources.text("wheel-resolve.sh")
    with Timer() as t:
        container = c.containers.create(base_ref, ["bash", "-c", script], entrypoint=[], user="root",
                                        labels={ROLE_LABEL: "lock"})
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for name, data in (("tmp/nodeforge-pip.py", resources.text("pip_resolve.py").encode()),
                                   ("tmp/nodeforge-pip.json", json.dumps(wanted).encode()),
                                   ("tmp/nodeforge-ca.pem", ca.encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            container.put_archive("/", buf.getvalue())
            container.start()
            status = container.wait(timeout=900)
            if status.get("StatusCode", 1) != 0:
                err = container.logs(stdout=False, stderr=True).decode(errors="replace")
                raise BuildFailed(f"wheel resolution for {plan.image} failed:\n" + "\n".join(err.splitlines()[-15:]))
            stdout = finished_output(container, f"wheel resolution for {plan.image}")
        finally:
            container.remove(force=True)
    line = next((x for x in stdout.splitlines() if x.startswith("@@nodeforge-wheels ")), None)
    if line is None:
        raise BuildFailed(f"wheel resolution for {plan.image} printed no result")
    found = json.loads(line.split(" ", 1)[1])["layers"]
    result: dict[str, dict[str, dict[str, str]]] = {}
    for layer, reqs in wanted:
        direct = {wheel_name(r) for r in reqs}
        result[layer] = {n: {**w, "direct": "true" if n in direct else "false"}
                         for n, w in found.get(layer, {}).items()}
    count = sum(len(v) for v in result.values())
    progress.say(plan.image, f"resolved {count} wheels in {t.seconds:.1f}s")
    return result
