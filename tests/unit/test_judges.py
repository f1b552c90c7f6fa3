"""Every (kind, scope, field) the test-kind table accepts is judged: the judge passes with the right
value and fails with a wrong one, at the image scope (facts read from the image) and at the
container and boot scopes (one shell probe and one judge for both). Fields that a scope cannot
check are definition errors when composing."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from builder.compose.tests import make_test
from builder.definitions.tables import TEST_KINDS, TEST_SCOPES, UNJUDGED
from builder.errors import Collector
from builder.plan import Test as PlanTest
from builder.verify import guest
from builder.verify.image import IMAGE_CHECKS
from builder.verify.judges import PROBE_JUDGES, FileFacts, file_facts, judge_file

SHA = "ce95eac7620f5323366f89ba4b99ea988e607b384606971c97a646b47f5a7f21"  # sha256 of "alpha=1\n"
OTHER_SHA = "0" * 64

# per kind: a base spec, the probe output of the container/boot scopes, and per field the value
# that holds for that output and one that does not
FILE_PROBE = f"640 app 1000 adm 4 regular file\n\n{SHA}  /etc/x.conf\n@@content@@\nalpha=1\n"
LINK_PROBE = "777 root 0 root 0 symbolic link\n/etc/x.conf\n\n@@content@@\nalpha=1\n"
CASES: dict[str, tuple[dict[str, Any], tuple[int, str, str], dict[str, tuple[Any, Any]]]] = {
    "file": ({"path": "/etc/x.conf"}, (0, FILE_PROBE, ""), {
        "exists": (True, False), "type": ("file", "directory"), "mode": ("0640", "0644"), "owner": ("app", "root"),
        "group": ("4", "root"), "sha256": (SHA, OTHER_SHA),
        "content": ({"contains": ["alpha=1"]}, {"contains": ["beta"]})}),
    "package": ({"name": "ca-certificates"}, (0, "install ok installed 20230311", ""), {
        "installed": (True, False), "version": ("20230311", "1.0")}),
    "command": ({"run": "true", "exit": 0}, (0, "hello\n", "oops\n"), {
        "exit": (0, 3), "stdout": ({"equals": "hello"}, {"contains": ["bye"]}),
        "stderr": ({"contains": ["oops"]}, {"not-contains": ["oops"]})}),
    "sysctl": ({"key": "vm.swappiness", "value": 1}, (0, "1\n", ""), {"value": (1, 60)}),
    "cmdline": ({"contains": []}, (0, "root=LABEL=x ro iommu=pt\n", ""), {"contains": (["iommu=pt"], ["iommu=off"])}),
    "module": ({"name": "nouveau"}, (0, "loaded=0\nrootfs=1\ninitramfs=1\n", ""), {
        "loaded": (False, True), "blacklisted": (True, False)}),
    "service": ({"name": "x.service"}, (0, "enabled=enabled\nactive=active\n", ""), {
        "enabled": (True, False), "active": (True, False)}),
}
# fields a probe consumes rather than a judge: changing them changes the probe (or how it runs)
SYMLINK_FIELDS = {"file": {"target"}}  # judged on a symlink's output: test_symlink_target_is_judged
PROBE_FIELDS = {"file": {"path"}, "package": {"name"}, "command": {"run", "timeout", "user"}, "sysctl": {"key"},
                "module": {"name"}, "service": {"name"}, "entrypoint": {"args", "timeout"}}


def test_every_field_of_every_probe_scope_is_covered() -> None:
    for kind, scopes in TEST_SCOPES.items():
        for scope, fields in scopes.items():
            if scope == "image" or kind == "entrypoint":
                continue
            covered = set(CASES[kind][2]) | PROBE_FIELDS.get(kind, set()) | SYMLINK_FIELDS.get(kind, set())
            assert fields - covered == set(), (kind, scope)


@pytest.mark.parametrize("kind,field", [(k, f) for k, (_, _, fs) in CASES.items() for f in fs])
def test_probe_judge_honours_the_field(kind: str, field: str) -> None:
    base, probe, fields = CASES[kind]
    right, wrong = fields[field]
    judge = PROBE_JUDGES[kind].judge
    assert judge({**base, field: right}, probe) == ""
    assert judge({**base, field: wrong}, probe) != ""


def test_symlink_target_is_judged() -> None:
    judge = PROBE_JUDGES["file"].judge
    spec = {"path": "/etc/link"}
    assert judge({**spec, "type": "symlink", "target": "/etc/x.conf"}, (0, LINK_PROBE, "")) == ""
    assert "points to '/etc/x.conf'" in judge({**spec, "target": "/etc/y.conf"}, (0, LINK_PROBE, ""))
    assert "does not exist" in judge(spec, (3, "", ""))


@pytest.mark.parametrize("kind", sorted(PROBE_FIELDS.keys() - {"entrypoint"}))
def test_probe_fields_reach_the_probe(kind: str) -> None:
    base, _, _ = CASES[kind]
    for field in PROBE_FIELDS[kind] - {"timeout", "user"}:
        a = PROBE_JUDGES[kind].probe({**base, field: "/one" if field == "path" else "one"})
        b = PROBE_JUDGES[kind].probe({**base, field: "/two" if field == "path" else "two"})
        assert a != b, (kind, field)


def test_timeout_and_user_reach_the_boot_runner() -> None:
    t = PlanTest("c", "l", "boot", "command", {"run": "id -u", "exit": 0, "timeout": 7, "user": "app"}, (), "f", 1)
    with tarfile.open(fileobj=io.BytesIO(guest.checks_archive([t], "img", "k" * 64))) as tar:
        member = tar.extractfile("list")
        assert member is not None
        assert member.read().decode() == "0 7 app\n"


def test_the_file_probe_script_reports_what_the_judge_reads(tmp_path: Path) -> None:
    """The real probe script, run here on a file, a symlink and nothing, parsed by the judge's reader."""
    f = tmp_path / "x.conf"
    f.write_text("alpha=1\n")
    f.chmod(0o640)
    (tmp_path / "link").symlink_to(f)

    def probe(path: Path) -> FileFacts:
        proc = subprocess.run(["bash", "-c", PROBE_JUDGES["file"].probe({"path": str(path)})],
                              capture_output=True, text=True)
        return file_facts(proc.returncode, proc.stdout)

    facts = probe(f)
    assert (facts.exists, facts.type, facts.mode) == (True, "file", 0o640)
    assert (facts.sha256, facts.content) == (SHA, "alpha=1\n")
    link = probe(tmp_path / "link")
    assert (link.type, link.target) == ("symlink", str(f))
    assert probe(tmp_path / "none").exists is False
    assert judge_file({"path": str(f), "type": "file", "sha256": SHA, "mode": "0640"}, facts) == ""
    assert judge_file({"path": str(f), "sha256": OTHER_SHA}, facts) != ""


# --- image scope: facts read from the image -----------------------------------------------------

class FakeView:
    """An image as the image-scope checks see it."""

    def __init__(self) -> None:
        self.files = {"/etc/x.conf": (b"alpha=1\n", tarfile.REGTYPE, ""), "/etc/link": (b"", tarfile.SYMTYPE, "x.conf")}

    def member(self, path: str) -> tuple[tarfile.TarInfo, bytes] | None:
        if path not in self.files:
            return None
        data, kind, target = self.files[path]
        info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
        info.type, info.mode, info.uid, info.gid, info.linkname, info.size = kind, 0o640, 1000, 4, target, len(data)
        return info, data

    def user(self, uid: int) -> str:
        return {1000: "app"}.get(uid, str(uid))

    def group(self, gid: int) -> str:
        return {4: "adm"}.get(gid, str(gid))

    def dpkg(self) -> dict[str, dict[str, str]]:
        return {"ca-certificates": {"Version": "20230311"}}

    def env(self) -> dict[str, str]:
        return {"CUDA_VERSION": "12.9"}

    def labels(self) -> dict[str, str]:
        return {"org.example.team": "gpu-infra"}

    def names(self, path: str) -> list[str]:
        return ["system/multi-user.target.wants/x.service"]


IMAGE_CASES: dict[str, tuple[dict[str, Any], dict[str, tuple[Any, Any]]]] = {
    "file": (CASES["file"][0], {**CASES["file"][2], "group": ("adm", "root")}),
    "package": (CASES["package"][0], {"installed": (True, False), "version": ("20230311", "1.0")}),
    "env": ({"name": "CUDA_VERSION"}, {"value": ("12.9", "13.0"), "contains": ("12", "13"), "absent": (False, True)}),
    "label": ({"name": "org.example.team"}, {"value": ("gpu-infra", "web"), "matches": ("^gpu", "^web")}),
    "service": ({"name": "x.service"}, {"enabled": (True, False)}),
}
IMAGE_IDENTITY = {"file": {"path"}, "package": {"name"}, "env": {"name"}, "label": {"name"}, "service": {"name"}}


def test_every_field_of_the_image_scope_is_covered() -> None:
    for kind, scopes in TEST_SCOPES.items():
        if "image" in scopes:
            target = IMAGE_CASES[kind][1].keys() | IMAGE_IDENTITY[kind] | {"target"}  # target: below
            assert scopes["image"] - target == set(), kind


@pytest.mark.parametrize("kind,field", [(k, f) for k, (_, fs) in IMAGE_CASES.items() for f in fs])
def test_image_judge_honours_the_field(kind: str, field: str) -> None:
    base, fields = IMAGE_CASES[kind]
    right, wrong = fields[field]
    check = IMAGE_CHECKS[kind]
    view: Any = FakeView()
    assert check(view, {**base, field: right}) == ""
    assert check(view, {**base, field: wrong}) != ""


def test_image_symlink_target_is_judged() -> None:
    view: Any = FakeView()
    assert IMAGE_CHECKS["file"](view, {"path": "/etc/link", "type": "symlink", "target": "x.conf"}) == ""
    assert IMAGE_CHECKS["file"](view, {"path": "/etc/link", "target": "y.conf"}) != ""


# --- fields a scope cannot check are definition errors -----------------------------------------

def test_a_field_the_scope_cannot_check_is_a_definition_error() -> None:
    assert UNJUDGED[("service", "image")] == {"active"}
    out = Collector()
    spec = {"name": "x.service", "enabled": True, "active": True}
    assert make_test({"name": "t", "service": spec}, "l", "f.yaml", 3, "tests[0]", out, UNJUDGED) is None
    assert [p.lint for p in out.problems] == ["test/field"] and "cannot check 'active'" in out.problems[0].message
    quiet = Collector()
    assert make_test({"name": "t", "scope": "boot", "service": spec}, "l", "f.yaml", 3, "tests[0]", quiet,
                     UNJUDGED) is not None
    assert quiet.problems == []


def test_every_kind_of_the_schema_has_a_judge_at_each_scope() -> None:
    for kind, scopes in TEST_SCOPES.items():
        assert set(TEST_KINDS[kind].fields) >= set().union(*scopes.values())
        for scope in scopes:
            if scope == "image":
                assert kind in IMAGE_CHECKS
            elif kind != "entrypoint":  # the entrypoint check runs the image itself, in a container
                assert kind in PROBE_JUDGES


def test_the_boot_runner_runs_every_probe_and_the_report_reads_them_back(tmp_path: Path) -> None:
    """The checks disk as the kernel layer's boot-check unit runs it (`sh run`), here on this host:
    the runner, its meta and list files and the probes; the report parser and the judges read it."""
    tests = [PlanTest("command", "l", "boot", "command", {"run": "echo hi; echo oops >&2", "exit": 0, "timeout": 10,
                                                          "stdout": {"equals": "hi"}}, (), "f", 1),
             PlanTest("file", "l", "boot", "file", {"path": str(tmp_path), "type": "directory"}, (), "f", 2),
             PlanTest("fails", "l", "boot", "command", {"run": "exit 4", "exit": 0, "timeout": 10}, (), "f", 3)]
    disk = tmp_path / "disk"
    with tarfile.open(fileobj=io.BytesIO(guest.checks_archive(tests, "img", "k" * 64))) as tar:
        tar.extractall(disk, filter="data")
    proc = subprocess.run(["sh", str(disk / "run")], capture_output=True, text=True, timeout=60)
    report = guest.GuestReport()
    for line in proc.stdout.splitlines():
        report.feed(line)
    assert report.begun and report.ended and sorted(report.probes) == [0, 1, 2]
    assert report.probes[0] == (0, "hi\n", "oops\n")
    verdicts = [guest.judge(t, *report.probes[i]) for i, t in enumerate(tests)]
    assert verdicts == ["", "", "exit status 4, expected 0"]
