"""Stage 7: verification. Image-scope checks read the image's config and files without running
anything; container-scope checks run in a test container (testcontainers); boot-scope checks run
in a booted VM (builder.boot). Reports: JUnit XML and JSON. Exit 0 pass, 1 fail, 2 environment."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import docker
import docker.errors

from . import engine
from .errors import EXIT_FAIL, EXIT_OK
from .load import Tree
from .plan import BuildPlan, Test

SESSION_LABEL = "io.nodeforge.test-session"


@dataclass
class Result:
    test: Test
    status: str  # passed | failed | skipped | not-run
    message: str = ""
    seconds: float = 0.0
    output: str = ""

    def to_json(self) -> dict[str, Any]:
        t = self.test
        return {"name": t.name, "layer": t.layer, "scope": t.scope, "kind": t.kind, "status": self.status,
                "message": self.message, "seconds": round(self.seconds, 3), "output": self.output[-4000:],
                "requires": list(t.requires), "definition": f"{t.file}:{t.line or '?'}"}


def has_gpu() -> bool:
    if os.environ.get("NODEFORGE_GPU") in ("0", "1"):
        return os.environ["NODEFORGE_GPU"] == "1"
    if not Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def capabilities() -> dict[str, bool]:
    return {"gpu": has_gpu(), "kvm": os.environ.get("NODEFORGE_KVM") == "1",
            "network": os.environ.get("NODEFORGE_OFFLINE") != "1"}


def match_text(spec: dict[str, Any] | None, text: str, what: str) -> str:
    """'' when the text satisfies the matcher, else why not."""
    if not spec:
        return ""
    for s in spec.get("contains") or []:
        if s not in text:
            return f"{what} does not contain {s!r}"
    for s in spec.get("not-contains") or []:
        if s in text:
            return f"{what} contains {s!r}"
    if spec.get("matches") and not re.search(spec["matches"], text, re.M):
        return f"{what} does not match {spec['matches']!r}"
    if spec.get("equals") is not None and text.strip() != spec["equals"].strip():
        return f"{what} is {text.strip()[:200]!r}, expected {spec['equals']!r}"
    return ""


# --- image scope: config and files, nothing executed ------------------------------------------------

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


def parse_dpkg_status(text: str) -> dict[str, dict[str, str]]:
    """Installed packages: name -> fields (Version, Status, ...)."""
    out: dict[str, dict[str, str]] = {}
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in para.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            name = fields["Package"]
            arch = fields.get("Architecture", "")
            out[name if arch in ("", "all", "amd64") else f"{name}:{arch}"] = fields
    return out


def check_file(view: ImageView, spec: dict[str, Any]) -> str:
    m = view.member(spec["path"])
    if not spec.get("exists", True):
        return f"{spec['path']} exists" if m else ""
    if m is None:
        return f"{spec['path']} does not exist"
    info, content = m
    kinds = {"file": info.isfile(), "directory": info.isdir(), "symlink": info.issym()}
    if spec.get("type") and not kinds[spec["type"]]:
        return f"{spec['path']} is not a {spec['type']}"
    if spec.get("mode"):
        want, have = int(spec["mode"], 8), stat.S_IMODE(info.mode)
        if want != have:
            return f"{spec['path']} has mode {have:04o}, expected {want:04o}"
    if spec.get("owner") and spec["owner"] not in (view.user(info.uid), str(info.uid)):
        return f"{spec['path']} is owned by {view.user(info.uid)}, expected {spec['owner']}"
    if spec.get("group") and spec["group"] not in (view.group(info.gid), str(info.gid)):
        return f"{spec['path']} has group {view.group(info.gid)}, expected {spec['group']}"
    if spec.get("target") is not None and info.linkname != spec["target"]:
        return f"{spec['path']} points to {info.linkname!r}, expected {spec['target']!r}"
    if spec.get("sha256"):
        import hashlib

        have_sha = hashlib.sha256(content).hexdigest()
        if have_sha != spec["sha256"]:
            return f"{spec['path']} has sha256 {have_sha}, expected {spec['sha256']}"
    return match_text(spec.get("content"), content.decode(errors="replace"), spec["path"])


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


# --- container scope: a test container --------------------------------------------------------------

def gpu_kwargs() -> dict[str, Any]:
    """Where a GPU is present, test containers get every GPU (as `docker run --gpus all`)."""
    if not has_gpu():
        return {}
    return {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]}


class TestContainer:
    """A running container of the image, its entrypoint replaced by a sleeper, removed at the end."""

    def __init__(self, ref: str, session: str) -> None:
        from testcontainers.core.container import DockerContainer

        self.dc = (DockerContainer(ref).with_command(["-c", "trap 'exit 0' TERM; sleep infinity & wait"])
                   .with_kwargs(entrypoint=["/bin/sh"], labels={SESSION_LABEL: session}, **gpu_kwargs()))
        self.dc.start()
        self.wrapped = self.dc.get_wrapped_container()
        self.ref = ref

    def exec(self, cmd: str, timeout: int, user: str | None = None) -> tuple[int, str, str, bool]:
        """(exit code, stdout, stderr, timed out)."""
        argv = ["timeout", "-k", "5", str(timeout), "/bin/bash", "-c", cmd]
        box: dict[str, Any] = {}

        def run() -> None:
            box["r"] = self.wrapped.exec_run(argv, demux=True, user=user or "")

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout + 15)
        if t.is_alive():
            return -1, "", "", True
        code, (out, err) = box["r"].exit_code, box["r"].output
        out_s = (out or b"").decode(errors="replace")
        err_s = (err or b"").decode(errors="replace")
        return code, out_s, err_s, code in (124, 137)

    def close(self) -> None:
        try:
            self.dc.stop()
        except Exception:
            pass


def check_command(box: TestContainer, spec: dict[str, Any]) -> tuple[str, str]:
    code, out, err, timed_out = box.exec(spec["run"], spec["timeout"], spec.get("user"))
    output = out + (("\n--- stderr\n" + err) if err else "")
    if timed_out:
        return f"timed out after {spec['timeout']}s", output
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}", output
    why = match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr")
    return why, output


def check_entrypoint(ref: str, spec: dict[str, Any], gpu: bool = False) -> tuple[str, str]:
    """Run the image as shipped: its own ENTRYPOINT, the test's args as the command, a fresh container."""
    c = engine.client()
    kwargs: dict[str, Any] = {}
    if gpu:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    container = c.containers.create(ref, command=list(spec.get("args") or []) or None,
                                    labels={SESSION_LABEL: "entrypoint"}, **kwargs)
    try:
        container.start()
        try:
            code = container.wait(timeout=spec["timeout"]).get("StatusCode", -1)
        except Exception:  # the engine's read timeout: the entrypoint did not finish
            return f"timed out after {spec['timeout']}s", ""
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    output = out + (("\n--- stderr\n" + err) if err else "")
    if code != spec["exit"]:
        return f"exit status {code}, expected {spec['exit']}", output
    return match_text(spec.get("stdout"), out, "stdout") or match_text(spec.get("stderr"), err, "stderr"), output


def package_query(name: str) -> str:
    return f"dpkg-query -W -f='${{Status}} ${{Version}}' {name}"


def judge_package(spec: dict[str, Any], code: int, out: str) -> str:
    """The verdict on package_query's output (in a container or a booted VM)."""
    installed = code == 0 and "install ok installed" in out
    if spec.get("installed", True) != installed:
        return f"{spec['name']} is {'installed' if installed else 'not installed'}"
    if installed and spec.get("version") and not out.endswith(" " + spec["version"]):
        return f"{spec['name']} is {out.split()[-1]}, expected {spec['version']}"
    return ""


def check_in_container(box: TestContainer, test: Test) -> tuple[str, str]:
    spec = test.spec
    if test.kind == "command":
        return check_command(box, spec)
    if test.kind == "entrypoint":
        return check_entrypoint(box.ref, spec, gpu="gpu" in test.requires)
    if test.kind == "package":
        code, out, _, _ = box.exec(package_query(spec["name"]), 30)
        return judge_package(spec, code, out), out
    if test.kind == "file":
        code, out, _, _ = box.exec(f"stat -c '%a %U %G %F' {spec['path']}", 30)
        if code != 0:
            return ("" if not spec.get("exists", True) else f"{spec['path']} does not exist"), out
        if not spec.get("exists", True):
            return f"{spec['path']} exists", out
        mode, owner, group, *_ = out.split()
        if spec.get("mode") and int(mode, 8) != int(spec["mode"], 8):
            return f"{spec['path']} has mode {mode}, expected {spec['mode']}", out
        if spec.get("owner") and owner != spec["owner"]:
            return f"{spec['path']} is owned by {owner}, expected {spec['owner']}", out
        if spec.get("group") and group != spec["group"]:
            return f"{spec['path']} has group {group}, expected {spec['group']}", out
        if spec.get("content"):
            _, text, _, _ = box.exec(f"cat {spec['path']}", 30)
            return match_text(spec["content"], text, spec["path"]), out
        return "", out
    return f"{test.kind} checks do not run in a container", ""


# --- orchestration ----------------------------------------------------------------------------------

def run_image_and_container(plan: BuildPlan, ref: str, tests: list[Test]) -> list[Result]:
    c = engine.client()
    results: list[Result] = []
    image_tests = [t for t in tests if t.scope == "image"]
    container_tests = [t for t in tests if t.scope == "container"]
    if image_tests:
        view = ImageView(c, ref)
        try:
            for t in image_tests:
                start = time.monotonic()
                try:
                    why = IMAGE_CHECKS[t.kind](view, t.spec)
                except Exception as e:  # a broken check is a failed check, with its reason
                    why = f"check raised {type(e).__name__}: {e}"
                results.append(Result(t, "failed" if why else "passed", why, time.monotonic() - start))
        finally:
            view.close()
    if container_tests:
        box = TestContainer(ref, uuid.uuid4().hex[:12])
        try:
            for t in container_tests:
                start = time.monotonic()
                why, output = check_in_container(box, t)
                results.append(Result(t, "failed" if why else "passed", why, time.monotonic() - start, output))
        finally:
            box.close()
    return results


def select(plan: BuildPlan, caps: dict[str, bool]) -> tuple[list[Test], list[Result]]:
    runnable, skipped = [], []
    for t in plan.tests:
        missing = [r for r in t.requires if not caps.get(r)]
        if missing:
            skipped.append(Result(t, "skipped", f"requires {', '.join(missing)}, not present here"))
        else:
            runnable.append(t)
    return runnable, skipped


def run_tests(plan: BuildPlan, report_dir: Path, boot: bool, tree: Tree, ref: str | None = None,
              boot_modes: tuple[str, ...] | None = None) -> int:
    from .errors import EnvironmentProblem

    ref = ref or plan.tags[0]
    c = engine.client()
    if not engine.image_exists(c, ref):
        raise EnvironmentProblem(f"image {ref} is not built; run `nodeforge build images/{plan.image}.yaml`")
    caps = capabilities()
    runnable, results = select(plan, caps)
    results += run_image_and_container(plan, ref, [t for t in runnable if t.scope != "boot"])
    boot_tests = [t for t in runnable if t.scope == "boot"]
    if boot_tests:
        if plan.kind != "node":
            results += [Result(t, "not-run", "boot scope: not a node image") for t in boot_tests]
        elif not boot:
            results += [Result(t, "not-run", "boot scope: runs in a booted VM (nodeforge test --boot)")
                        for t in boot_tests]
        else:
            from .boot import MODES, run_boot_tests

            results += run_boot_tests(plan, tree, boot_tests, boot_modes or MODES)
    write_reports(plan, results, report_dir)
    summary(plan, results)
    return EXIT_FAIL if any(r.status == "failed" for r in results) else EXIT_OK


def summary(plan: BuildPlan, results: list[Result]) -> None:
    for r in results:
        mark = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip", "not-run": "----"}[r.status]
        extra = f"  ({r.message})" if r.message else ""
        print(f"{mark} [{r.test.scope}] {r.test.layer}: {r.test.name}{extra}")
        if r.status == "failed" and r.output:
            print("     | " + "\n     | ".join(r.output.strip().splitlines()[-10:]))
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped", "not-run")}
    print(f"{plan.image}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
          f"{counts['not-run']} not run")


def write_reports(plan: BuildPlan, results: list[Result], report_dir: Path) -> tuple[Path, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    data = {"image": plan.image, "key": plan.key, "tags": list(plan.tags),
            "results": [r.to_json() for r in results],
            "counts": {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped", "not-run")}}
    json_path = report_dir / f"{plan.image}.json"
    _atomic_write(json_path, json.dumps(data, indent=2) + "\n")
    suites = ET.Element("testsuites", name=f"nodeforge {plan.image}")
    for scope in ("image", "container", "boot"):
        rs = [r for r in results if r.test.scope == scope]
        if not rs:
            continue
        suite = ET.SubElement(suites, "testsuite", name=f"{plan.image}.{scope}", tests=str(len(rs)),
                              failures=str(sum(r.status == "failed" for r in rs)),
                              skipped=str(sum(r.status in ("skipped", "not-run") for r in rs)),
                              time=f"{sum(r.seconds for r in rs):.3f}")
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=f"{plan.image}.{scope}.{r.test.layer}",
                                 name=r.test.name, time=f"{r.seconds:.3f}")
            if r.status == "failed":
                ET.SubElement(case, "failure", message=r.message).text = r.output[-4000:]
            elif r.status in ("skipped", "not-run"):
                ET.SubElement(case, "skipped", message=r.message)
    xml_path = report_dir / f"{plan.image}.junit.xml"
    _atomic_write(xml_path, ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n")
    return json_path, xml_path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
