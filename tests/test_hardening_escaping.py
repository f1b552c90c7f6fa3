"""Issue 21 items 2 and 10: a layer parameter is escaped for where it is written (shell, a sourced
/etc/default file, a systemd unit, GRUB, iPXE), parameters that are paths, addresses and URLs have
grammars, and an offline source's package list is pinned and only what is asked for is installed."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shlex
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.compose import render
from builder.errors import Collector

ROOT = Path(__file__).resolve().parent.parent

# one value of each kind that would be syntax if it were written unescaped
NASTY = [
    "/var/lib/x; touch PWNED",
    "it's",
    '0.0.0.0" ; touch PWNED ; "',
    "$(touch PWNED)",
    "`touch PWNED`",
    "two\nlines; touch PWNED",
    "100% ${HOME} \\ back",
]


# ------------------------------------------------------------------ parsers of the destinations

def unit_words(line: str) -> list[str]:
    """The words of a systemd unit value as systemd splits them (extract_first_word with
    EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), then specifiers (%%) and ExecStart's $$ resolved."""
    words, word, quote, i, started = [], "", "", 0, False
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            word += {"n": "\n", "t": "\t"}.get(line[i + 1], line[i + 1])
            i += 2
            started = True
            continue
        if quote:
            if c == quote:
                quote = ""
            else:
                word += c
        elif c in "\"'":
            quote, started = c, True
        elif c.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word += c
            started = True
        i += 1
    assert not quote, f"unterminated quote in {line!r}"
    if started:
        words.append(word)
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def environment_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= parser (env-file.c) for the lines nodeforge writes: KEY=VALUE with
    single and double quotes that may follow one another."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition("=")
        value, state, i = "", "pre", 0
        while i < len(rest):
            c = rest[i]
            if state == "pre" and c in "'\"":
                state = c
            elif state == "pre":
                state = "value"
                value += c
            elif state == "value":
                value += c
            elif state in "'\"" and c == state:  # the closing quote
                state = "pre"
            elif state == '"' and c == "\\" and i + 1 < len(rest):
                i += 1
                value += rest[i] if rest[i] in '"\\`$' else "\\" + rest[i]
            else:
                value += c
            i += 1
        out[key] = value
    return out


def rendered(kind: str, text: str, value: str) -> tuple[str | None, Collector]:
    env = render.environment(ROOT / "layers" / "base" / "files")
    out = Collector()
    with render.destination(kind):
        return render.render_string(env, text, {"v": value}, out, "layer.yaml", 1, "x"), out


# ------------------------------------------------------------------ every destination kind

@pytest.mark.parametrize("value", NASTY)
def test_shell_destination_keeps_a_value_one_inert_word(value: str, tmp_path: Path) -> None:
    script, out = rendered(render.SHELL, "printf '%s' {{ v }} >out\nprintf '%s' one{{ v }}two >joined\n", value)
    assert script is not None, out.problems
    subprocess.run(["bash", "-n", "-c", script], check=True)
    subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True)
    assert (tmp_path / "out").read_text() == value
    assert (tmp_path / "joined").read_text() == f"one{value}two"
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", NASTY)
def test_sourced_default_file_keeps_a_value_for_shell_and_systemd(value: str, tmp_path: Path) -> None:
    kind = render.file_destination("/etc/default/x")
    assert kind == render.SHELL
    text, out = rendered(kind, "# settings\nX={{ v }}\n", value)
    assert text is not None, out.problems
    (tmp_path / "x").write_text(text)
    proc = subprocess.run(["bash", "-c", ". ./x && printf '%s' \"$X\""], cwd=tmp_path, capture_output=True,
                          text=True, check=True)
    assert proc.stdout == value and not (tmp_path / "PWNED").exists()
    if "\n" not in value:  # systemd's EnvironmentFile= reads the same value
        assert environment_file(text)["X"] == value


@pytest.mark.parametrize("value", NASTY)
def test_unit_destination_keeps_a_value_one_argument_or_refuses_it(value: str) -> None:
    kind = render.file_destination("/etc/systemd/system/x.service")
    assert kind == render.UNIT
    text, out = rendered(kind, "ExecStart=/usr/bin/x --dir {{ v }}\n", value)
    if "\n" in value:  # a unit line cannot hold a newline: a definition error, not a broken unit
        assert text is None and "cannot hold control character" in out.problems[0].message
        return
    assert text is not None, out.problems
    assert unit_words(text.partition("=")[2]) == ["/usr/bin/x", "--dir", value]


@pytest.mark.parametrize("value", NASTY)
def test_grub_destination_keeps_a_value_one_word_or_refuses_it(value: str) -> None:
    text, out = rendered(render.GRUB, "linux /vmlinuz {{ v }}\n", value)
    if "\n" in value:
        assert text is None and out.problems
        return
    assert text is not None
    assert shlex.split(text) == ["linux", "/vmlinuz", value]  # GRUB's quotes are POSIX single quotes


@pytest.mark.parametrize("value", NASTY)
def test_ipxe_destination_keeps_a_value_one_word_or_refuses_it(value: str) -> None:
    text, out = rendered(render.IPXE, "kernel {{ v }}\n", value)
    if text is None:  # iPXE cannot quote white space or ${: refused as a definition error
        assert re.search(r"\s|\$\{", value) and "boot.ipxe cannot hold" in out.problems[0].message
        return
    assert text.split() == ["kernel", value]


def test_destination_follows_where_a_file_goes() -> None:
    fd = render.file_destination
    assert fd("/etc/default/grub") == render.SHELL
    assert fd("/usr/local/bin/x", "#!/bin/bash") == render.SHELL
    assert fd("/usr/lib/x/y.sh") == render.SHELL
    assert fd("/etc/systemd/system/a.service.d/x.conf") == render.UNIT
    assert fd("/usr/lib/x/a.timer") == render.UNIT
    assert fd("/srv/tftp/boot.ipxe") == render.IPXE
    assert fd("/boot/grub/grub.cfg") == render.GRUB
    assert fd("/etc/x.conf") == fd("/usr/bin/x", "#!/usr/bin/env python3") == render.PLAIN
    # a daemon's own configuration under /etc/systemd/ is not a unit: timesyncd reads quotes literally
    assert fd("/etc/systemd/timesyncd.conf.d/50-site.conf") == fd("/etc/systemd/system.conf.d/x.conf") \
        == render.PLAIN


def test_words_quotes_each_item_and_macros_are_not_escaped_twice(tmp_path: Path) -> None:
    text, _ = rendered(render.SHELL, "{% macro m() %}a={{ v }}{% endmacro %}x {{ ['a b', 'c'] | words }} "
                       "{{ m() }} {{ v | raw }}", "p q")
    assert text == "x 'a b' c a='p q' p q"


# every use of the raw marker in the repository's layers, each reviewed: a new one fails here
RAW_USES: dict[str, int] = {}


def test_raw_marker_uses_are_reviewed() -> None:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "layers").rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".j2", "") and path.stat().st_size < 1 << 20:
            n = len(re.findall(r"\|\s*raw\b", path.read_text(errors="replace")))
            if n:
                found[str(path.relative_to(ROOT))] = n
    assert found == RAW_USES


# ------------------------------------------------------------------ through the composer, every kind

ESC_LAYER = """\
name: esc
summary: a parameter written into every kind of destination
applies-to: [node]
requires: [base]
params:
  v: {type: str, default: VALUE, doc: any text}
files:
  - {path: /etc/default/esc, content: "V={{ v }}\\n"}
  - {path: /usr/local/bin/esc, mode: "0755", content: "#!/bin/sh\\nprintf '%s' {{ v }}\\n"}
  - {path: /etc/systemd/system/esc.service, content: "[Service]\\nExecStart=/usr/bin/printf %%s {{ v }}\\n"}
steps:
  - {name: esc, run: "printf '%s' {{ v }} >/tmp/esc-step"}
tests:
  - {name: esc, command: {run: "printf '%s' {{ v }}"}}
"""


def plan(tree: Path, image: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), "plan", "--json", image, *args],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.fixture
def esc_tree(scratch_tree: Path) -> Path:
    img = (scratch_tree / "images/node-minimal.yaml").read_text()
    img = img.replace("name: node-minimal", "name: esc-node").replace("  - monitoring\n", "  - monitoring\n  - esc\n")
    (scratch_tree / "images/esc-node.yaml").write_text(img.replace("nodeforge/node-minimal", "nodeforge/esc-node"))
    (scratch_tree / "layers/esc").mkdir()
    return scratch_tree


@pytest.mark.parametrize("value", [v for v in NASTY if "\n" not in v])
def test_a_parameter_stays_one_inert_value_in_every_destination(esc_tree: Path, value: str, tmp_path: Path) -> None:
    (esc_tree / "layers/esc/layer.yaml").write_text(ESC_LAYER.replace("VALUE", json.dumps(value)))
    proc = plan(esc_tree, "esc-node")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    step = next(s for s in doc["steps"] if s["layer"] == "esc")
    files = {f["path"]: f["content"] for f in step["files"]}
    run = next(t for t in doc["tests"] if t["layer"] == "esc")["spec"]["run"]
    work = tmp_path / "work"
    work.mkdir()
    apply = step["apply"].replace("/tmp/esc-step", str(work / "step"))
    subprocess.run(["bash", "-c", apply], cwd=work, check=True, capture_output=True)
    assert (work / "step").read_text() == value
    for script in (run, files["/usr/local/bin/esc"]):
        assert subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True).stdout == value
    sourced = subprocess.run(["bash", "-c", f"{files['/etc/default/esc']}\nprintf '%s' \"$V\""], cwd=work,
                             capture_output=True, text=True).stdout
    assert sourced == value == environment_file(files["/etc/default/esc"])["V"]
    exec_start = files["/etc/systemd/system/esc.service"].split("ExecStart=")[1].strip()
    assert unit_words(exec_start) == ["/usr/bin/printf", "%s", value]
    assert not (work / "PWNED").exists()


# ------------------------------------------------------------------ types with grammars

@pytest.mark.parametrize(("setting", "expected"), [
    ("monitoring.textfile_dir=/var/lib/x; touch /tmp/y", "an absolute path inside the image"),
    ('monitoring.listen=0.0.0.0" ; touch /tmp/y ; "', "an IP address"),
    ("nvidia-container-runtime.offline_source=http://h/x'", "percent-encode"),
    ("nvidia-container-runtime.repository=https://user:secret@h/deb/", "without user information"),
    ("nvidia-driver.fabricmanager_source=https://h/debs/';id;'", "percent-encode"),
    ("nvidia-driver.fabricmanager_keyring=relative.gpg", "an absolute path inside the image"),
    ("nvidia-container-runtime.offline_source=http://127.0.0.1:1/debs/", "the list's own sha256 must be pinned"),
])
def test_a_value_its_type_refuses_is_a_definition_error(setting: str, expected: str) -> None:
    proc = plan(ROOT, "images/gpu-node.yaml", setting, "nvidia-driver.fabricmanager=true")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_typed_values_that_fit_plan(tmp_path: Path) -> None:
    digest = "0" * 64
    (tmp_path / "SHA256SUMS").write_text("")  # a build-host source: a directory with its list
    proc = plan(ROOT, "images/gpu-node.yaml", "monitoring.listen=[::]", "monitoring.textfile_dir=/srv//prom/",
                f"nvidia-container-runtime.offline_source=file:{tmp_path}/",
                "nvidia-driver.fabricmanager_source=https://mirror.example:8443/fm/",
                f"nvidia-driver.fabricmanager_sums_sha256={digest}", "nvidia-driver.fabricmanager=true")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    monitoring = next(s for s in doc["steps"] if s["layer"] == "monitoring")
    assert "--web.listen-address=[::]:9100 --collector.textfile.directory=/srv/prom'" in \
        monitoring["files"][0]["content"]


# ------------------------------------------------------------------ vendor-debs: offline sources (item 10)

VENDOR_DEBS = ROOT / "layers/nvidia-driver/files/vendor-debs"
FAKE_APT_GET = """#!/bin/sh
# stand-in apt-get: records its arguments; "install FILE.deb..." marks those packages installed
echo "apt-get $*" >>"$FAKE_STATE/log"
for a in "$@"; do
    case "$a" in *.deb) echo "$(dpkg-deb -f "$a" Version)" >"$FAKE_STATE/$(dpkg-deb -f "$a" Package)" ;; esac
done
"""
FAKE_DPKG_QUERY = """#!/bin/sh
# stand-in dpkg-query -W -f '${Version}' NAME
eval "name=\\${$#}"
cat "$FAKE_STATE/$name" 2>/dev/null
"""


def deb(out: Path, name: str, version: str, depends: str = "") -> None:
    root = out / f"src-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    (root / "DEBIAN/control").write_text(control + (f"Depends: {depends}\n" if depends else ""))
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)], check=True, capture_output=True)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """An offline source: a wanted package that depends on a listed one and on a Debian one, and an
    unrelated listed package that must not be installed."""
    d = tmp_path / "debs"
    d.mkdir()
    deb(d, "tk", "1.0-1", "tk-base (= 1.0-1), libc6 (>= 2.36) | libc6-compat, adduser:any")
    deb(d, "tk-base", "1.0-1")
    deb(d, "unrelated", "9.9-1")
    sums = subprocess.run("sha256sum *.deb", shell=True, cwd=d, check=True, capture_output=True, text=True).stdout
    (d / "SHA256SUMS").write_text(sums)
    return d


@pytest.fixture
def served(source: Path) -> Iterator[str]:
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(source))  # noqa: E731
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def vendor_debs(tmp_path: Path, src: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    state, bin_ = tmp_path / "state", tmp_path / "bin"
    state.mkdir(exist_ok=True)
    bin_.mkdir(exist_ok=True)
    for name, text in (("apt-get", FAKE_APT_GET), ("dpkg-query", FAKE_DPKG_QUERY)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "FAKE_STATE": str(state)}
    proc = subprocess.run(["sh", str(VENDOR_DEBS), "--what", "test", "--list", "t", "--uri", "https://x.invalid/",
                           "--suite", "/", "--keyring", "/nonexistent", "--source", src, *extra, "tk=1.0-1"],
                          env=env, capture_output=True, text=True, timeout=60)
    return proc, state


def sums_digest(source: Path) -> str:
    return hashlib.sha256((source / "SHA256SUMS").read_bytes()).hexdigest()


def test_http_source_installs_only_the_asked_package_and_its_listed_dependencies(
        tmp_path: Path, source: Path, served: str) -> None:
    proc, state = vendor_debs(tmp_path, served, "--sums-sha256", sums_digest(source))
    assert proc.returncode == 0, proc.stderr
    install = [line for line in (state / "log").read_text().splitlines() if " install " in line]
    assert len(install) == 1 and "tk_1.0-1_all.deb" in install[0] and "tk-base_1.0-1_all.deb" in install[0]
    assert "unrelated" not in install[0] and not (state / "unrelated").exists()


def test_http_source_without_the_list_digest_is_refused(tmp_path: Path, served: str) -> None:
    proc, state = vendor_debs(tmp_path, served)
    assert proc.returncode == 2 and "--sums-sha256" in proc.stderr
    assert not (state / "log").exists()


def test_a_list_other_than_the_pinned_one_is_refused(tmp_path: Path, source: Path, served: str) -> None:
    pinned = sums_digest(source)
    with (source / "SHA256SUMS").open("a") as f:  # the server's list changed after it was pinned
        f.write(f"{'0' * 64}  evil_1_all.deb\n")
    proc, state = vendor_debs(tmp_path, served, "--sums-sha256", pinned)
    assert proc.returncode == 1 and f"with sha256 {pinned}" in proc.stderr
    assert not (state / "log").exists()


def test_file_source_needs_no_list_digest_and_a_missing_package_is_named(tmp_path: Path, source: Path) -> None:
    proc, _ = vendor_debs(tmp_path, f"file:{source}")
    assert proc.returncode == 0, proc.stderr
    (source / "SHA256SUMS").write_text("".join(line + "\n" for line in (source / "SHA256SUMS").read_text()
                                               .splitlines() if "tk_" not in line))
    (tmp_path / "again").mkdir()
    proc, _ = vendor_debs(tmp_path / "again", f"file:{source}")
    assert proc.returncode == 1 and "does not list tk" in proc.stderr
