"""A layer's scripts (bash), run by the engine build and by the Packer export alike: its
package-phase lines (wheels, holds, `phase: packages` steps) and its config-phase apply script
(users, ownership, services, then the layer's steps)."""

from __future__ import annotations

import shlex
from typing import Any

from .. import lockfile
from ..plan import ContextFile
from .render import SHELL, destination
from .scope import LayerScope

WHEELS_TMP = "/tmp/nodeforge-wheels"
# set by an offline build's package step: the mirror's wheel directory, read instead of the network
WHEEL_MIRROR_VARIABLE = "NODEFORGE_WHEEL_MIRROR"


def wheel_lines(wheels: dict[str, dict[str, str]], target: str, build_only: list[str]) -> list[str]:
    """Download each locked wheel, check its sha256, unpack it into the target; no pip in the image."""
    if not wheels:
        return ["# wheels: not locked yet (`nodeforge lock` resolves them)"]
    tmp = WHEELS_TMP
    lines = ["# wheels (exact versions and sha256 from the lock file; unpacked, no pip in the image)",
             f"install -d -m 0777 {tmp}", f"install -d -m 0755 {shlex.quote(target)}",
             "# extra CAs of the build host's network, from a build argument; never left in the image",
             "ca=()",
             'if [ -n "${NODEFORGE_CA_BUNDLE:-}" ]; then',
             f'  printf "%s\\n" "$NODEFORGE_CA_BUNDLE" >{tmp}/ca.pem; ca=(-o Acquire::https::CaInfo={tmp}/ca.pem)',
             "fi"]
    for name, w in sorted(wheels.items()):
        base = lockfile.wheel_file(w["url"])
        file = f"{tmp}/{base}"
        lines += [f"# {name} {w['version']}",
                  f'if [ -n "${{{WHEEL_MIRROR_VARIABLE}:-}}" ]; then '
                  f'cp -- "${WHEEL_MIRROR_VARIABLE}"/{shlex.quote(base)} {shlex.quote(file)}',
                  f"else /usr/lib/apt/apt-helper -q \"${{ca[@]}}\" download-file {shlex.quote(w['url'])} "
                  f"{shlex.quote(file)} SHA256:{w['sha256']}; fi",
                  f"echo {shlex.quote(w['sha256'] + '  ' + file)} | sha256sum --check --quiet",
                  f"unzip -q -o {shlex.quote(file)} -d {shlex.quote(target)}", f"rm -f {shlex.quote(file)}"]
    lines.append(f"rm -rf {tmp}")
    if build_only:
        names = " ".join(p.partition("=")[0] for p in build_only)
        lines.append(f"apt-get purge -y -q --auto-remove {names}  # build-only: unpacks the wheels")
    return lines


def install_lines(s: LayerScope) -> str:
    """The layer's package-phase lines after the apt install (compose.phases runs the install):
    wheels, holds, and the steps marked `phase: packages`."""
    c = s.carry
    lines: list[str] = []
    if c["wheels"] and (c["locked_wheels"] or s.data["packages"]["pip"]):
        lines += wheel_lines(c["locked_wheels"], c["wheel_target"], c["build_only"])
    if c["holds"]:
        lines += [shlex.join(["apt-mark", "hold", *c["holds"]])]
    lines += _step_lines(s, "packages")
    return "\n".join(lines) + "\n" if lines else ""


def _user_lines(users: list[dict[str, Any]], files: list[ContextFile]) -> list[str]:
    lines = []
    for u in users:
        opts = ["--create-home", "--shell", u["shell"]]
        if u.get("uid") is not None:
            opts += ["--uid", str(u["uid"])]
        if u.get("system"):
            opts.append("--system")
        if u.get("groups"):
            opts += ["--groups", ",".join(u["groups"])]
        lines.append(f"id -u {shlex.quote(u['name'])} >/dev/null 2>&1 || {shlex.join(['useradd', *opts, u['name']])}")
    for f in files:
        if (f.owner, f.group) != ("root", "root"):
            lines.append(f"chown {shlex.quote(f.owner)}:{shlex.quote(f.group)} {shlex.quote(f.path)}")
    return lines


def _service_lines(services: dict[str, list[str]]) -> list[str]:
    lines = []
    if services["enable"] or services["disable"]:
        lines.append("command -v systemctl >/dev/null || { echo 'services need systemd in the image' >&2; exit 1; }")
    lines += [f"systemctl enable {shlex.quote(unit)}" for unit in services["enable"]]
    lines += [f"systemctl disable {shlex.quote(unit)} || true" for unit in services["disable"]]
    return lines


def _step_lines(s: LayerScope, phase: str) -> list[str]:
    lines = []
    for i, step in enumerate(s.data["steps"]):
        if step.get("phase", "config") != phase:
            continue
        with destination(SHELL):  # a step is bash: every `{{ }}` value is one quoted word
            run = s.text(step["run"], f"steps[{i}].run", "steps", i)
        if run is not None:
            lines += [f"# step: {step['name']}", "(", run.rstrip("\n"), ")"]
    return lines


def apply_script(s: LayerScope) -> str:
    """The config-phase script (users, ownership, services, steps); empty when the layer only writes
    files. Packages are installed in the package phase (compose.phases), before every layer's files."""
    services = {k: s.carry.get(f"services.{k}", []) for k in ("enable", "disable")}  # rendered by the handlers
    lines = _user_lines(s.data["users"], s.files) + _service_lines(services) + _step_lines(s, "config")
    if not lines:
        return ""
    head = [f"# nodeforge layer {s.name}: {s.data['summary']}", "set -euo pipefail",
            "export DEBIAN_FRONTEND=noninteractive"]
    return "\n".join([*head, *lines]) + "\n"
