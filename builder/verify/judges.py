"""One judge per test kind, shared by every scope.

A scope gathers facts its own way: the image scope reads the image's files and config through
the engine; the container and boot scopes run the kind's shell probe (in a test container, or in
the booted node through the checks disk) and hand its output to the same judge. Which fields
each scope checks is the test-kind table (definitions.tables.TEST_SCOPES); the unit tests show,
field by field, that every judge honours every field its table lists."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import resources
from .result import judge_package, match_text, package_query

TIMED_OUT = 124  # timeout(1)
Spec = dict[str, Any]
Probe = tuple[int, str, str]  # exit status, stdout, stderr


@dataclass(frozen=True)
class FileFacts:
    """What a scope found at a path; None fields were not found (a missing file has exists=False)."""

    exists: bool
    type: str = ""  # file | directory | symlink | other
    mode: int = 0
    owner: tuple[str, ...] = ()  # user name and uid (either matches)
    group: tuple[str, ...] = ()
    target: str = ""
    sha256: str = ""
    content: str = ""


def judge_file(spec: Spec, f: FileFacts) -> str:
    path = spec["path"]
    if not spec.get("exists", True):
        return f"{path} exists" if f.exists else ""
    if not f.exists:
        return f"{path} does not exist"
    checks: list[tuple[str, bool, str]] = [
        ("type", f.type == spec.get("type"), f"{path} is a {f.type}, expected a {spec.get('type')}"),
        ("mode", spec.get("mode") is not None and f.mode == int(str(spec["mode"]), 8),
         f"{path} has mode {f.mode:04o}, expected {spec.get('mode')}"),
        ("owner", spec.get("owner") in f.owner,
         f"{path} is owned by {'/'.join(f.owner)}, expected {spec.get('owner')}"),
        ("group", spec.get("group") in f.group,
         f"{path} has group {'/'.join(f.group)}, expected {spec.get('group')}"),
        ("target", f.target == spec.get("target"), f"{path} points to {f.target!r}, expected {spec.get('target')!r}"),
        ("sha256", f.sha256 == spec.get("sha256"), f"{path} has sha256 {f.sha256}, expected {spec.get('sha256')}"),
    ]
    for name, ok, why in checks:
        if spec.get(name) is not None and not ok:
            return why
    return match_text(spec.get("content"), f.content, path)


FILE_TYPES = {"regular file": "file", "regular empty file": "file", "directory": "directory",
              "symbolic link": "symlink"}
CONTENT_MARK = "@@content@@"


def file_facts(code: int, out: str) -> FileFacts:
    """The facts of resources/file-probe.sh's output (exit 3: nothing at the path)."""
    if code == 3:
        return FileFacts(False)
    head, _, content = out.partition(CONTENT_MARK + "\n")
    meta = [*head.splitlines(), "", "", ""]
    fields = meta[0].split(maxsplit=5)
    if len(fields) < 6:
        return FileFacts(True, "other")
    mode, user, uid, group, gid, kind = fields
    return FileFacts(True, FILE_TYPES.get(kind, "other"), int(mode, 8), (user, uid), (group, gid), meta[1],
                     meta[2].split(" ")[0], content)


def judge_command(spec: Spec, p: Probe, timeout: int) -> str:
    code, out, err = p
    if code == TIMED_OUT and spec["exit"] != TIMED_OUT:
        return f"timed out after {timeout}s"
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}"
    return match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr")


def _facts(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def judge_sysctl(spec: Spec, p: Probe) -> str:
    code, out, err = p
    if code != 0:
        return f"sysctl {spec['key']} cannot be read: {err.strip()[:200]}"
    have, want = " ".join(out.split()), " ".join(str(spec["value"]).split())
    return "" if have == want else f"{spec['key']} is {have!r}, expected {want!r}"


def judge_cmdline(spec: Spec, p: Probe) -> str:
    args = p[1].split()
    missing = [a for a in spec["contains"] if a and a not in args]
    return f"/proc/cmdline lacks {' '.join(missing)} (it is: {p[1].strip()})" if missing else ""


def judge_module(spec: Spec, p: Probe) -> str:
    f = _facts(p[1])
    if spec.get("loaded") is not None and (f.get("loaded") == "1") != spec["loaded"]:
        return f"{spec['name']} is {'loaded' if f.get('loaded') == '1' else 'not loaded'}"
    if spec.get("blacklisted") is not None:
        for where, place in (("rootfs", "the root file system"), ("initramfs", "the initramfs")):
            if (f.get(where) == "1") != spec["blacklisted"]:
                return f"{spec['name']} is {'' if f.get(where) == '1' else 'not '}blacklisted in {place}"
    return ""


def judge_service(spec: Spec, p: Probe) -> str:
    f = _facts(p[1])
    if spec.get("enabled") is not None and (f.get("enabled") == "enabled") != spec["enabled"]:
        return f"{spec['name']} is {f.get('enabled', '?')}"
    if spec.get("active") is not None and (f.get("active") == "active") != spec["active"]:
        return f"{spec['name']} is {f.get('active', '?')}"
    return ""


def _with_args(script: str, *args: str) -> str:
    return f"set -- {' '.join(shlex.quote(a) for a in args)}\n" + resources.text(script)


@dataclass(frozen=True)
class Judge:
    """How one test kind is checked by a shell probe (container and boot scopes)."""

    probe: Callable[[Spec], str]  # the script, run with bash
    judge: Callable[[Spec, Probe], str]  # '' when the output satisfies the check, else why not


PROBE_JUDGES: dict[str, Judge] = {
    "file": Judge(lambda s: _with_args("file-probe.sh", s["path"]), lambda s, p: judge_file(s, file_facts(p[0], p[1]))),
    "package": Judge(lambda s: package_query(shlex.quote(s["name"])) + "\n", lambda s, p: judge_package(s, p[0], p[1])),
    "command": Judge(lambda s: s["run"] + "\n", lambda s, p: judge_command(s, p, int(s.get("timeout") or 60))),
    "sysctl": Judge(lambda s: f"sysctl -n {shlex.quote(s['key'])}\n", judge_sysctl),
    "cmdline": Judge(lambda s: "cat /proc/cmdline\n", judge_cmdline),
    "module": Judge(lambda s: _with_args("module-probe.sh", s["name"]), judge_module),
    "service": Judge(lambda s: _with_args("service-probe.sh", s["name"]), judge_service),
}


def probe_output(code: int, out: str, err: str) -> str:
    return f"exit {code}\n{out}" + (f"\n--- stderr\n{err}" if err else "")


def command_output(out: str, err: str) -> str:
    return out + (("\n--- stderr\n" + err) if err else "")
