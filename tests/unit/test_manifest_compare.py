"""Rollout manifests without the engine: comparison in text and Markdown, the provenance
statement, the source revision from git, and lock drift with the security origin."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder import debversion, lockfile
from builder.engine import resolve
from builder.manifest import compare, document, provenance

ROOT = Path(__file__).resolve().parents[2]


def manifest(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": 2, "image": "n", "kind": "node", "version": "1.0", "summary": "s", "config": "default",
        "sets": [], "tags": ["nodeforge/n:1.0"], "plan_key": "a" * 64, "image_digest": "sha256:" + "1" * 64,
        "registry_digest": None, "source_date_epoch": 1735689600,
        "base": {"kind": "debian", "key": "b" * 64, "image": None, "debian": {"suite": "bookworm"},
                 "name": "nodeforge-base:bbb", "digest": "sha256:" + "2" * 64},
        "layers": [
            {"name": "base", "image": "n", "key": "c" * 64, "summary": "base",
             "parameters": {"tools": {"value": ["procps"], "source": "default (layers/base/layer.yaml:10)"}}},
            {"name": "sysctl", "image": "n", "key": "d" * 64, "summary": "sysctl",
             "parameters": {"swappiness": {"value": 1, "source": "config default (configs/default.yaml:8)"}}},
        ],
        "packages": [{"name": "curl", "version": "7.88.1-10", "architecture": "amd64", "layer": "base",
                      "sha256": "e" * 64},
                     {"name": "libc6", "version": "2.36-9", "architecture": "amd64", "layer": None, "sha256": None}],
        "wheels": [{"name": "cupy-cuda12x", "version": "13.3.0", "sha256": "f" * 64, "url": "https://x/cupy.whl",
                    "layer": "python-cupy", "image": "n", "direct": True}],
        "kernel_cmdline": "root=LABEL=r ro iommu=pt pcie_aspm=off",
        "outputs": {"disk.raw": {"role": "raw", "sha256": "3" * 64}, "sbom.spdx.json": {"role": "sbom",
                                                                                    "sha256": "4" * 64}},
        "lock": {"image": "n", "path": "images/n.lock", "sha256": "5" * 64}, "inherited_locks": [],
        "builder": {"name": "nodeforge", "version": "0.1.0"},
        "source": {"revision": "6" * 40, "dirty": False, "repository": "local"},
    }
    doc.update(changes)
    return doc


def changed_copy(doc: dict[str, Any]) -> dict[str, Any]:
    """A parameter changed (with its source), a package version changed, a layer added, the command
    line and an output changed."""
    new = copy.deepcopy(doc)
    new["layers"][1]["parameters"]["swappiness"] = {"value": 10, "source": "--set sysctl.swappiness=10"}
    new["layers"][1]["key"] = "7" * 64
    port = {"value": 9100, "source": "default (layers/monitoring/layer.yaml:11)"}
    new["layers"].append({"name": "monitoring", "image": "n", "key": "8" * 64, "summary": "m",
                          "parameters": {"port": port}})
    new["packages"][0]["version"] = "7.88.1-10+deb12u5"
    new["kernel_cmdline"] = "root=LABEL=r ro iommu=pt"
    new["outputs"]["disk.raw"]["sha256"] = "9" * 64
    new["plan_key"] = "0" * 64
    return new


def test_text_names_every_change() -> None:
    a = manifest()
    b = changed_copy(a)
    lines = compare.text("a.json", "b.json", compare.compare(a, b))
    assert lines[:2] == ["--- a.json", "+++ b.json"]
    assert f"  ~ plan key {'a' * 12} -> {'0' * 12}" in lines
    assert f"  ~ sysctl {'d' * 12} -> {'7' * 12}" in lines
    assert f"  + monitoring {'8' * 12}" in lines
    assert ("  ~ sysctl.swappiness 1 -> 10 (config default (configs/default.yaml:8) -> --set sysctl.swappiness=10)"
            in lines)
    assert "  + monitoring.port 9100 (default (layers/monitoring/layer.yaml:11))" in lines
    assert "  ~ curl:amd64 7.88.1-10 -> 7.88.1-10+deb12u5" in lines
    assert "  - pcie_aspm=off" in lines
    assert f"  ~ disk.raw {'3' * 12} -> {'9' * 12}" in lines
    assert "wheels:" not in lines and "  ~ libc6" not in "\n".join(lines)
    assert compare.changed(compare.compare(a, b))


def test_identical_manifests_compare_equal() -> None:
    sections = compare.compare(manifest(), manifest())
    assert not compare.changed(sections)
    assert compare.text("a", "b", sections) == ["--- a", "+++ b"]
    md = compare.markdown_for("a.json", "b.json", manifest(), manifest())
    assert "**No changes.**" in md and not any(line.startswith("### ") for line in md)


def test_markdown_has_headline_counts_then_tables() -> None:
    a = manifest()
    b = changed_copy(a)
    b["wheels"][0]["version"] = "13.4.0"
    md = compare.markdown_for("old/manifest.json", "new/manifest.json", a, b)
    assert md[0] == "## Rollout review: n 1.0 → n 1.0"
    assert "| manifest | `old/manifest.json` | `new/manifest.json` |" in md
    headline = next(line for line in md if line.startswith("**build**"))
    assert "**layers**: 2 (1 added, 1 changed)" in headline
    assert "**parameters**: 2 (1 added, 1 changed)" in headline
    assert "**packages**: 1 (1 changed)" in headline and "**wheels**: 1 (1 changed)" in headline
    assert "**kernel command line**: 1 (1 removed)" in headline and "**outputs**: 1 (1 changed)" in headline
    i = md.index("### Parameters")
    assert md[i + 2] == "| change | item | before | after | where set |"
    assert ("| changed | `sysctl.swappiness` | `1` | `10` | "
            "`config default (configs/default.yaml:8) -> --set sysctl.swappiness=10` |") in md
    assert "| changed | `curl:amd64` | `7.88.1-10` | `7.88.1-10+deb12u5` |" in md
    assert "| removed | `pcie_aspm=off` | `pcie_aspm=off` |  |" in md
    for i, line in enumerate(md):  # every row of a section's table has as many cells as its header
        if line.startswith("### "):
            rows = [r for r in md[i + 2:] if r.startswith("|")]
            rows = rows[:next((k for k, r in enumerate(md[i + 2:]) if not r), len(rows))]
            assert all(r.count("|") == rows[0].count("|") for r in rows), rows

def test_markdown_cells_escape_pipes_and_backticks() -> None:
    assert compare.cell("a|b") == "`a\\|b`"
    assert compare.cell("x `y`") == "`` x `y` ``"
    assert compare.cell("two\nlines") == "`two\\nlines`"
    assert compare.cell("") == ""


def test_manifest_files_through_the_cli(tmp_path: Path) -> None:
    """`nodeforge diff A.json B.json` needs no engine: exit 1 and the text; --format markdown;
    identical manifests exit 0; a manifest against an image tag is a usage error."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(document.dumps(manifest()))
    b.write_bytes(document.dumps(changed_copy(manifest())))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "builder", "diff", *args], capture_output=True, text=True,
                              cwd=ROOT, env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent"})

    proc = run(str(a), str(b))
    assert proc.returncode == 1, proc.stderr
    assert "  ~ curl:amd64 7.88.1-10 -> 7.88.1-10+deb12u5" in proc.stdout
    assert proc.stdout.splitlines()[0].startswith(f"--- {a} (n 1.0, plan aaaaaaaaaaaa, revision 666666666666")
    md = run(str(a), str(b), "--format", "markdown")
    assert md.returncode == 1 and "### Packages" in md.stdout
    same = run(str(a), str(a))
    assert same.returncode == 0 and len(same.stdout.splitlines()) == 2
    mixed = run(str(a), "nodeforge/n:1.0")
    assert mixed.returncode == 2 and "not one of each" in mixed.stderr
    (tmp_path / "other.json").write_text(json.dumps({"spdxVersion": "SPDX-2.3"}))
    wrong = run(str(a), str(tmp_path / "other.json"))
    assert wrong.returncode == 2 and "not a nodeforge manifest" in wrong.stderr
    missing = run(str(a), str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "cannot be read" in missing.stderr
    old = tmp_path / "format-1.json"  # written before manifests carried the OCI digest: still read
    first = {k: v for k, v in manifest().items() if k != "image_digest"}
    old.write_bytes(document.dumps({**first, "format": 1, "engine_image_id": "sha256:" + "7" * 64}))
    proc = run(str(old), str(a))
    assert proc.returncode == 1 and f"  ~ image digest null -> {'1' * 12}" in proc.stdout, proc.stdout + proc.stderr


def test_provenance_statement_of_a_manifest() -> None:
    doc = manifest()
    stmt = provenance.statement(doc, "manifest.json", "m" * 64)
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    assert stmt["subject"] == [{"name": "nodeforge/n:1.0", "digest": {"sha256": "1" * 64}},  # the image
                               {"name": "disk.raw", "digest": {"sha256": "3" * 64}},
                               {"name": "sbom.spdx.json", "digest": {"sha256": "4" * 64}},
                               {"name": "manifest.json", "digest": {"sha256": "m" * 64}}]
    build = stmt["predicate"]["buildDefinition"]
    assert build["externalParameters"] == {"image": "n", "config": "default", "sets": []}
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    assert deps["source"]["digest"] == {"gitCommit": "6" * 40} and "uri" not in deps["source"]  # no remote
    remote = manifest(source={"revision": "6" * 40, "dirty": True, "repository": "https://example.org/site.git"})
    source = provenance.statement(remote, "manifest.json", "m" * 64)["predicate"]["buildDefinition"][
        "resolvedDependencies"][0]
    assert source["uri"] == f"git+https://example.org/site.git@{'6' * 40}" and source["annotations"]["dirty"]
    assert deps["base:nodeforge-base:bbb"]["digest"] == {"sha256": "2" * 64}
    assert deps["images/n.lock"]["digest"] == {"sha256": "5" * 64}
    assert stmt["predicate"]["runDetails"]["builder"]["id"] == "https://nodeforge.dev/builder@0.1.0"
    assert "startedOn" not in json.dumps(stmt)  # no wall-clock time
    assert document.dumps(stmt) == document.dumps(provenance.statement(manifest(), "manifest.json", "m" * 64))


def test_source_revision_from_git(tmp_path: Path) -> None:
    assert document.source_revision(tmp_path) is None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert document.source_revision(tmp_path) == {"revision": head, "dirty": False, "repository": "local"}
    (tmp_path / "f").write_text("2")
    assert document.source_revision(tmp_path) == {"revision": head, "dirty": True, "repository": "local"}


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "images" / "manifest.json"
    document.write_atomically(target, b"{}\n")
    document.write_atomically(target, b'{"a": 1}\n')
    assert target.read_bytes() == b'{"a": 1}\n' and [p.name for p in target.parent.iterdir()] == ["manifest.json"]


# --- lock drift -------------------------------------------------------------------------------------
def test_security_origin_is_read_from_apt_release_list() -> None:
    assert lockfile.from_security("Debian-Security:12/oldstable-security")
    assert lockfile.from_security("Debian:12.15/oldstable, Debian-Security:12/oldstable-security")
    assert lockfile.from_security("Debian:12.15/oldstable") is False
    assert lockfile.from_security("Debian:12/bookworm-security")
    assert lockfile.from_security("") is None and lockfile.from_security(None) is None


def test_lock_drift_shows_old_new_and_security_origin(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    old = lockfile.Lock("img", "b", {"base": {"direct": {"curl": "7.88.1-10"},
                                              "deps": {"libssl3": "3.0.20-1~deb12u2", "libc6": "2.36-9",
                                                       "gone": "1"}}})
    new = lockfile.Lock("img", "b", {"base": {"direct": {"curl": "7.88.1-10+deb12u5"},
                                              "deps": {"libssl3": "3.0.22-1~deb12u2", "libc6": "2.36-9+deb12u4",
                                                       "fresh": "2"}}},
                        archives={"curl": {"version": "7.88.1-10+deb12u5", "architecture": "amd64",
                                           "sha256": "a" * 64, "origin": "Debian:12.15/oldstable"},
                                  "libssl3": {"version": "3.0.22-1~deb12u2", "architecture": "amd64",
                                              "sha256": "b" * 64, "origin": "Debian-Security:12/oldstable-security"},
                                  "fresh": {"version": "2", "architecture": "all", "sha256": "c" * 64,
                                            "origin": "Debian:12.15/oldstable, Debian-Security:12/oldstable-security"}})
    lockfile.write(tmp_path, old)
    lockfile.write(tmp_path, new)
    again = lockfile.read(tmp_path, "img")
    assert again is not None and again.archives == new.archives  # the archives section round-trips
    assert lockfile.drift(old, again) == [
        "~ base: curl 7.88.1-10 -> 7.88.1-10+deb12u5 [not security: Debian:12.15/oldstable]",
        "+ base: fresh 2 [security: Debian:12.15/oldstable, Debian-Security:12/oldstable-security]",
        "- base: gone 1 (no longer installed)",
        "~ base: libc6 2.36-9 -> 2.36-9+deb12u4 [origin unknown]",  # +debNuN alone says nothing
        "~ base: libssl3 3.0.20-1~deb12u2 -> 3.0.22-1~deb12u2 [security: Debian-Security:12/oldstable-security]",
    ]
    assert lockfile.drift(again, again) == []
    assert lockfile.diff(old, new)[:2] == ["- base: curl 7.88.1-10", "+ base: curl 7.88.1-10+deb12u5"]


VERSION_PAIRS = [("535.309.01-0+deb12u1", "535.261.03-1"), ("1.0~rc1", "1.0"), ("1.0", "1.0-0"),
                 ("1:0.1", "9.9"), ("2.36-9+deb12u4", "2.36-9"), ("1.0a", "1.0+"), ("1.0~~", "1.0~"),
                 ("7.88.1-10+deb12u5", "7.88.1-10+deb12u12"), ("3.0.22-1~deb12u2", "3.0.3-1"),
                 ("1.2.3", "1.2.3"), ("0:1.2", "1.2"), ("1.18.0-1", "1.18.0-1ubuntu1"), ("10", "9a")]


@pytest.mark.parametrize("a,b", VERSION_PAIRS)
def test_version_order_is_dpkgs(a: str, b: str) -> None:
    def dpkg(op: str) -> bool:
        return subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0
    want = 1 if dpkg("gt") else -1 if dpkg("lt") else 0
    assert debversion.compare(a, b) == want and debversion.compare(b, a) == -want


def test_madison_lines_give_the_newest_security_version() -> None:
    assert resolve.security_versions("nvidia-smi 535.261.03-0+deb12u1\nnvidia-smi 535.309.01-0+deb12u1\n"
                                     "libssl3 3.0.9-1\n\nbroken\n") == {"nvidia-smi": "535.309.01-0+deb12u1",
                                                                         "libssl3": "3.0.9-1"}


def test_lock_check_names_a_package_held_below_its_security_update() -> None:
    """A pin (the driver layer's version) keeps the fresh resolution where the lock is: no version
    changes, yet the security archive offers a newer one. lock --check says so, [security]."""
    layers = {"nvidia-driver": {"direct": {"nvidia-smi": "535.261.03-1"}, "deps": {"libc6": "2.36-9+deb12u4"}}}
    old = lockfile.Lock("gpu-node", "b", layers)
    fresh = lockfile.Lock("gpu-node", "b", layers, security={"nvidia-smi": "535.309.01-0+deb12u1",
                                                             "libc6": "2.36-9+deb12u4", "other": "9"})
    assert lockfile.diff(old, fresh) == []
    assert lockfile.drift(old, fresh) == [
        "! nvidia-driver: nvidia-smi 535.261.03-1 is held below the security archive's 535.309.01-0+deb12u1 "
        "[security]: raise the pin that holds it (the layer's version parameter), then run nodeforge lock"]
    at_security = lockfile.Lock("gpu-node", "b", {"nvidia-driver": {"direct": {"nvidia-smi": "535.309.01-0+deb12u1"},
                                                                    "deps": {}}}, security=fresh.security)
    assert lockfile.drift(at_security, at_security) == []
    moved = lockfile.drift(old, at_security)  # a package the resolution moves is named once, by its move
    assert len(moved) == 2 and moved[1].startswith("~ nvidia-driver: nvidia-smi 535.261.03-1 -> 535.309.01")


def test_archives_do_not_enter_the_lock_entry_a_step_key_reads() -> None:
    lock = lockfile.Lock("img", "b", {"base": {"direct": {"curl": "1"}, "deps": {}}},
                         archives={"curl": {"version": "1", "architecture": "amd64", "sha256": "a" * 64,
                                            "origin": "x"}})
    assert lockfile.entry(lock, "base") == {"direct": {"curl": "1"}, "deps": {}}


def test_resolver_output_gives_each_locked_deb_its_sha256_and_origin() -> None:
    from builder.engine import resolve

    stdout = "\n".join([
        "@@nodeforge-layer base",
        "Inst libssl3 [3.0.20-1~deb12u1] (3.0.22-1~deb12u2 Debian-Security:12/oldstable-security [amd64])",
        "Inst curl (7.88.1-10+deb12u15 Debian:12.15/oldstable, Debian-Security:12/oldstable-security [amd64])",
        "Inst unlocked (1 Debian:12.15/oldstable [all])",
        "Have ca-certificates 20230311+deb12u1",
        "@@nodeforge-archives",
        "Package: libssl3", "Version: 3.0.22-1~deb12u2", "Architecture: amd64", "SHA256: " + "a" * 64,
        "Package: curl", "Version: 7.88.1-10+deb12u15", "Architecture: amd64", "SHA256: " + "b" * 64,
        "Package: ca-certificates", "Version: 20230311+deb12u1", "Architecture: all", "SHA256: " + "c" * 64,
        "Package: unlocked", "Version: 1", "Architecture: all", "SHA256: " + "d" * 64,
        "@@nodeforge-end"])
    locked = {("libssl3", "3.0.22-1~deb12u2"), ("curl", "7.88.1-10+deb12u15"), ("ca-certificates", "20230311+deb12u1")}
    assert resolve.archives(stdout, locked) == {
        "ca-certificates": {"version": "20230311+deb12u1", "architecture": "all", "sha256": "c" * 64},
        "curl": {"version": "7.88.1-10+deb12u15", "architecture": "amd64", "sha256": "b" * 64,
                 "origin": "Debian:12.15/oldstable, Debian-Security:12/oldstable-security"},
        "libssl3": {"version": "3.0.22-1~deb12u2", "architecture": "amd64", "sha256": "a" * 64,
                    "origin": "Debian-Security:12/oldstable-security"},
    }


def test_build_identity_changes_keep_names_whole_and_shorten_digests() -> None:
    long_config = "configs/site-a-rack-07-nvlink-h100-partition-b.yaml"
    b = manifest(config=long_config, sets=["sysctl.swappiness=10"], image_digest="sha256:" + "9" * 64)
    lines = compare.text("a", "b", compare.compare(manifest(), b))
    assert f"  ~ config default -> {long_config}" in lines
    assert "  ~ --set none -> sysctl.swappiness=10" in lines
    assert f"  ~ image digest {'1' * 12} -> {'9' * 12}" in lines


def format3(**changes: Any) -> dict[str, Any]:
    """A format 3 manifest: an inherited layer with its key, the files the layers write."""
    doc = manifest(format=3, keys={"plan": "a" * 64, "content": "c1" * 32, "assembly": "a1" * 32})
    doc["layers"].insert(0, {"name": "slim", "image": "parent", "inherited": True, "key": "9" * 64,
                             "summary": "slim", "parameters": {}})
    doc["files"] = [
        {"path": "/etc/sysctl.d/90-nodeforge-sysctl.conf", "layer": "sysctl", "image": "n", "sha256": "1" * 64,
         "mode": "0644", "lines": ["# sysctl", "vm.swappiness = 1", "vm.dirty_ratio = 10"]},
        {"path": "/usr/lib/x.bin", "layer": "base", "image": "n", "sha256": "2" * 64, "mode": "0755"},
        {"path": "/etc/slim.conf", "layer": "slim", "image": "parent", "inherited": True, "sha256": "3" * 64,
         "mode": "0644", "lines": ["a"]}]
    doc.update(changes)
    return doc


def test_files_layers_and_keys_of_a_one_value_change() -> None:
    """The review of a one-value change names the layer (key old -> new), the parameter with where
    it was set, and the file with its changed line; an inherited layer's key change says which image
    built it."""
    a = format3()
    b = copy.deepcopy(a)
    b["layers"][2]["key"] = "7" * 64
    b["layers"][2]["parameters"]["swappiness"] = {"value": 5, "source": "--set sysctl.swappiness=5"}
    b["layers"][0]["key"] = "8" * 64
    b["files"][0]["sha256"], b["files"][0]["lines"][1] = "4" * 64, "vm.swappiness = 5"
    b["files"][2]["sha256"], b["files"][2]["lines"] = "5" * 64, ["b"]
    b["keys"]["assembly"] = "a2" * 32
    lines = compare.text("a.json", "b.json", compare.compare(a, b))
    assert f"  ~ sysctl {'d' * 12} -> {'7' * 12}" in lines
    assert f"  ~ slim {'9' * 12} -> {'8' * 12} (inherited from image parent)" in lines
    assert ("  ~ sysctl.swappiness 1 -> 5 (config default (configs/default.yaml:8) -> --set sysctl.swappiness=5)"
            in lines)
    path = "/etc/sysctl.d/90-nodeforge-sysctl.conf"
    assert f"  ~ {path} sha256 {'1' * 12} mode 0644 -> sha256 {'4' * 12} mode 0644 (layer sysctl)" in lines
    i = lines.index(f"  ~ {path} sha256 {'1' * 12} mode 0644 -> sha256 {'4' * 12} mode 0644 (layer sysctl)")
    assert lines[i + 1:i + 7] == [f"      --- a{path}", f"      +++ b{path}", "      @@ -1,3 +1,3 @@",
                                  "       # sysctl", "      -vm.swappiness = 1", "      +vm.swappiness = 5"]
    assert "  ~ /etc/slim.conf" in "\n".join(lines) and "(layer slim of image parent)" in "\n".join(lines)
    assert f"  ~ keys assembly {'a1' * 6}, content {'c1' * 6} -> assembly {'a2' * 6}, content {'c1' * 6}" in lines
    assert "/usr/lib/x.bin" not in "\n".join(lines)

    md = compare.markdown_for("a.json", "b.json", a, b)
    assert (f"| changed | `{path}` | `sha256 {'1' * 12} mode 0644` | `sha256 {'4' * 12} mode 0644` "
            "| `layer sysctl` |") in md
    j = md.index(f"{path}:")
    assert md[j + 2:j + 8] == [f"    --- a{path}", f"    +++ b{path}", "    @@ -1,3 +1,3 @@", "     # sysctl",
                               "    -vm.swappiness = 1", "    +vm.swappiness = 5"]
    assert "| change | item | before | after | note |" in md  # layers and files: a note, not "where set"


def test_added_and_removed_files_and_a_bounded_line_diff() -> None:
    a = format3()
    b = copy.deepcopy(a)
    del b["files"][1]
    b["files"].append({"path": "/etc/new.conf", "layer": "base", "image": "n", "sha256": "6" * 64, "mode": "0600",
                       "lines": ["x"]})
    b["files"][0]["lines"], b["files"][0]["sha256"] = [f"line {i}" for i in range(200)], "7" * 64
    sections = {s.title: s for s in compare.compare(a, b)}
    changes = {c.item: c for c in sections["files"].changes}
    assert changes["/usr/lib/x.bin"].op == "-" and changes["/etc/new.conf"].op == "+"
    assert changes["/etc/new.conf"].detail[-1] == "+x"  # a new text file: every line added
    big = changes["/etc/sysctl.d/90-nodeforge-sysctl.conf"].detail
    assert len(big) == compare.DIFF_LINES + 1 and big[-1].startswith("... ") and big[-1].endswith(" more lines")


def test_base_row_is_readable_not_json() -> None:
    a = format3()
    b = copy.deepcopy(a)
    b["base"]["key"], b["base"]["digest"] = "f" * 64, "sha256:" + "e" * 64
    (row,) = [c for c in compare.compare(a, b)[0].changes if c.item == "base"]
    assert row.old == f"debian bookworm key {'b' * 12} name nodeforge-base:bbb digest {'2' * 12}"
    assert row.new == f"debian bookworm key {'f' * 12} name nodeforge-base:bbb digest {'e' * 12}"
    image = {"kind": "image", "key": "c" * 64, "image": "container-base", "debian": None, "name": None,
             "digest": None}
    assert compare._base(image) == f"image container-base key {'c' * 12}"


def test_format3_manifest_reads_back_with_files_and_keys(tmp_path: Path) -> None:
    from builder.manifest import reader
    path = tmp_path / "manifest.json"
    path.write_bytes(document.dumps(format3()))
    doc = reader.read(path)
    assert doc["files"][0]["lines"][1] == "vm.swappiness = 1" and doc["layers"][0]["inherited"] is True
    assert doc["keys"]["plan"] == "a" * 64
