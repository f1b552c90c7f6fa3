"""Issue 21, item 3 and the mirror's low items, without an engine: mirrors made by hand in a
temporary directory (a fake base tarball, a hand-written index). A mirror's index is untrusted:
its shape is checked (every section, every key), every path it names is a checked file of the
mirror (no `..`, no absolute path, no symbolic link, no FIFO), an offline build refuses a mirror
not made for the image, and a base is imported only when the very bytes the engine reads have the
index's sha256, tagged under the key the build computed. `nodeforge mirror` names the destination
when the disk is full and leaves no half-written index or directory behind."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from builder import lockfile
from builder.cli import main
from builder.compose.image import compose
from builder.definitions.load import load_tree
from builder.engine import bootstrap, cache, recorded
from builder.errors import BuildFailed, UsageError
from builder.mirror import gather
from builder.mirror import index as mirror_index
from builder.mirror.offline import prepare
from builder.paths import base_repo
from builder.plan import BuildPlan
from builder.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "node-minimal"
BASE = b"a base tarball, made by hand"
GUARD_SECONDS = 30  # a hang guard: every case here takes well under a second


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError(f"ran longer than {GUARD_SECONDS} s (a FIFO waited on?)")


@pytest.fixture(autouse=True)
def guard() -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(GUARD_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def plan() -> BuildPlan:
    return compose(load_tree(ROOT), IMAGE, None, [])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _doc(plan: BuildPlan, files: dict[str, bytes]) -> dict[str, Any]:
    """An index that covers the image: its base in bases/, every locked package in that base."""
    lock = lockfile.read(ROOT, IMAGE)
    assert lock is not None
    key = plan.base.key
    packages: dict[str, dict[str, Any]] = {}
    for entry in lock.layers.values():
        for part in entry.values():
            for name, version in part.items():
                packages.setdefault(name, {})[version] = {"in_base": key}
    return {"format": 1,
            "images": {IMAGE: {"lock_sha256": _sha(lockfile.path_for(ROOT, IMAGE).read_bytes()), "base": key}},
            "bases": {key: f"bases/{key}.tar"}, "packages": packages, "wheels": {},
            "files": {rel: {"sha256": _sha(data), "size": len(data)} for rel, data in files.items()}}


def _mirror(tmp_path: Path, plan: BuildPlan, files: dict[str, bytes] | None = None,
            doc: dict[str, Any] | None = None) -> Path:
    root = tmp_path / "mirror"
    files = {f"bases/{plan.base.key}.tar": BASE} if files is None else files
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    root.mkdir(exist_ok=True)
    (root / mirror_index.INDEX).write_text(json.dumps(_doc(plan, files) if doc is None else doc))
    return root


def _write(root: Path, doc: dict[str, Any]) -> None:
    (root / mirror_index.INDEX).write_text(json.dumps(doc))


def _refused(root: Path) -> str:
    """What check() says of a refused mirror (message and each problem)."""
    with pytest.raises(UsageError) as e:
        mirror_index.check(root)
    return e.value.render()


def _prepare(root: Path, plan: BuildPlan) -> mirror_index.Index:
    return prepare(ROOT, [plan], root, Progress(quiet=True))


def test_a_hand_made_mirror_is_accepted(tmp_path: Path, plan: BuildPlan) -> None:
    """The harness: the cases below differ from this mirror in one thing each."""
    root = _mirror(tmp_path, plan)
    index = _prepare(root, plan)
    rel, sha = index.base_file(plan.base.key)
    assert (rel, sha) == (f"bases/{plan.base.key}.tar", _sha(BASE))
    assert index.base_files() == {plan.base.key: (rel, sha)}


# --- item 3: the bases -----------------------------------------------------------------------------

@pytest.mark.parametrize("listed", [False, True])
@pytest.mark.parametrize("path", ["../outside.tar", "/tmp/outside.tar", "bases/../../outside.tar", "./bases/k.tar",
                                  "bases//k.tar", "bases/./k.tar", ""])
def test_a_base_path_outside_the_mirror_is_refused(tmp_path: Path, plan: BuildPlan, path: str, listed: bool) -> None:
    """Listed among the files or not (the issue's case: not listed, so nothing checked it)."""
    outside = tmp_path / "outside.tar"
    outside.write_bytes(b"poison")
    root = _mirror(tmp_path, plan)
    doc = _doc(plan, {f"bases/{plan.base.key}.tar": BASE})
    doc["bases"][plan.base.key] = path
    if listed:
        doc["files"][path] = {"sha256": _sha(b"poison"), "size": 6}  # the index even vouches for it
    _write(root, doc)
    text = _refused(root)
    assert f"bases.{plan.base.key}:" in text and "a path relative to the mirror" in text
    assert "Traceback" not in text


def test_a_base_whose_file_is_not_among_the_files_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    doc = _doc(plan, {f"bases/{plan.base.key}.tar": BASE})
    doc["bases"][plan.base.key] = "bases/other.tar"
    _write(root, doc)
    text = _refused(root)
    assert f"bases.{plan.base.key}: the base's file 'bases/other.tar' is not among the index's files" in text


def test_a_base_whose_sha256_differs_from_the_index_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    (root / f"bases/{plan.base.key}.tar").write_bytes(BASE.replace(b"hand", b"HAND"))  # same size
    assert f"bases/{plan.base.key}.tar: sha256 differs from the index" in _refused(root)


def test_an_empty_index_is_refused_for_the_image(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan, files={}, doc={"format": 1})
    assert mirror_index.check(root).files == {}  # a well-formed index of nothing ...
    with pytest.raises(UsageError, match="the mirror has no base") as e:
        _prepare(root, plan)  # ... covers no image
    assert "nodeforge mirror node-minimal DIR" in str(e.value)


def test_a_mirror_not_made_for_the_image_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    doc = _doc(plan, {f"bases/{plan.base.key}.tar": BASE})
    doc["images"] = {"other-image": doc["images"][IMAGE]}
    _write(root, doc)
    with pytest.raises(UsageError, match=r"was not made for node-minimal \(its index lists other-image\)"):
        _prepare(root, plan)
    doc["images"] = {IMAGE: {**doc["images"]["other-image"], "base": "0" * 64}}
    _write(root, doc)
    with pytest.raises(UsageError, match="the definitions changed since the mirror was made"):
        _prepare(root, plan)


def test_a_deb_whose_sha256_differs_from_the_lock_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    """The index and the file agree, but the lock (reviewed, in the repository) says other bytes."""
    lock = lockfile.read(ROOT, IMAGE)
    assert lock is not None
    version = lock.archives["prometheus-node-exporter"]["version"]
    deb = f"debs/prometheus-node-exporter_{version}_amd64.deb"
    files = {f"bases/{plan.base.key}.tar": BASE, deb: b"not the locked package"}
    doc = _doc(plan, files)
    doc["packages"]["prometheus-node-exporter"][version] = {"file": deb, "sha256_from": "lock"}
    root = _mirror(tmp_path, plan, files, doc)
    with pytest.raises(UsageError) as e:
        _prepare(root, plan)
    assert f"the mirror's {deb} has sha256 {_sha(b'not the locked package')}" in str(e.value)
    assert lock.archives["prometheus-node-exporter"]["sha256"] in str(e.value)


class FakeAPI:
    """The engine's import, tag and remove, as far as import_checked uses them."""

    def __init__(self, swap: Path | None = None) -> None:
        self.swap = swap  # a file rewritten once the import began (the mirror changed under the build)
        self.received = b""
        self.tags: list[tuple[str, str, str]] = []
        self.removed: list[str] = []

    def import_image(self, src: Iterator[bytes], changes: list[str], stream_src: bool) -> str:
        assert stream_src and changes == bootstrap.CHANGES
        for chunk in src:
            self.received += chunk
        return '{"status":"sha256:' + "a" * 64 + '"}\r\n'

    def tag(self, image: str, repository: str, tag: str) -> None:
        self.tags.append((image, repository, tag))

    def remove_image(self, image: str, force: bool) -> None:
        self.removed.append(image)


class FakeClient:
    def __init__(self) -> None:
        self.api = FakeAPI()


def test_a_checked_base_is_tagged_under_the_key_the_build_computed(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    rel, sha = _prepare(root, plan).base_file(plan.base.key)
    c = FakeClient()
    bootstrap.import_checked(c, plan.base, root / rel, sha)  # type: ignore[arg-type]
    assert c.api.received == BASE
    assert c.api.tags == [("sha256:" + "a" * 64, base_repo(), plan.base.key)] and c.api.removed == []


def test_a_base_changed_after_the_check_is_not_cached(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    rel, sha = _prepare(root, plan).base_file(plan.base.key)
    (root / rel).write_bytes(b"poisoned after the index check")
    c = FakeClient()
    with pytest.raises(UsageError, match="changed after the mirror was checked, so it was not imported"):
        bootstrap.import_checked(c, plan.base, root / rel, sha)  # type: ignore[arg-type]
    assert c.api.tags == [] and c.api.removed == ["sha256:" + "a" * 64]  # imported untagged, then removed


@pytest.mark.parametrize("kind", ["fifo", "symlink", "missing"])
def test_a_base_that_is_not_a_regular_file_is_not_imported(tmp_path: Path, plan: BuildPlan, kind: str) -> None:
    tar = tmp_path / "base.tar"
    if kind == "fifo":
        os.mkfifo(tar)
    elif kind == "symlink":
        (tmp_path / "real.tar").write_bytes(BASE)
        tar.symlink_to(tmp_path / "real.tar")
    c = FakeClient()
    with pytest.raises(UsageError, match=f"base tarball {tar}"):
        bootstrap.import_checked(c, plan.base, tar, _sha(BASE))  # type: ignore[arg-type]
    assert c.api.received == b"" and c.api.tags == []


def test_a_base_without_a_digest_is_never_imported(tmp_path: Path, plan: BuildPlan) -> None:
    (tmp_path / "base.tar").write_bytes(BASE)
    c = FakeClient()
    with pytest.raises(BuildFailed, match="no sha256 to check it against"):
        bootstrap.import_checked(c, plan.base, tmp_path / "base.tar", None)  # type: ignore[arg-type]
    assert c.api.received == b"" and c.api.tags == []


# --- low items: FIFOs, links, shapes ----------------------------------------------------------------

def test_a_fifo_listed_with_size_0_is_refused_not_waited_on(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    os.mkfifo(root / "debs.fifo")
    doc = _doc(plan, {f"bases/{plan.base.key}.tar": BASE, "debs.fifo": b""})
    _write(root, doc)
    assert "debs.fifo: not a regular file" in _refused(root)


def test_an_unlisted_fifo_is_named_not_opened(tmp_path: Path, plan: BuildPlan) -> None:
    root = _mirror(tmp_path, plan)
    os.mkfifo(root / "stray")
    assert "stray: not in the index" in _refused(root)


def test_a_fifo_as_the_index_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    root = tmp_path / "mirror"
    root.mkdir()
    os.mkfifo(root / mirror_index.INDEX)
    assert "not a regular file" in _refused(root)


@pytest.mark.parametrize("how", ["file", "directory"])
def test_a_symbolic_link_in_the_mirror_is_refused(tmp_path: Path, plan: BuildPlan, how: str) -> None:
    """Even one to a file with the sha256 the index gives: a mirror holds regular files only."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "p.deb").write_bytes(b"deb")
    files = {f"bases/{plan.base.key}.tar": BASE, "debs/p.deb": b"deb"}
    root = _mirror(tmp_path, plan, files)
    shutil.rmtree(root / "debs")
    if how == "file":
        (root / "debs").mkdir()
        (root / "debs" / "p.deb").symlink_to(tmp_path / "elsewhere" / "p.deb")
    else:
        (root / "debs").symlink_to(tmp_path / "elsewhere")
    assert "debs/p.deb: reached through a symbolic link" in _refused(root)


KEY = "0" * 64
SHAPES: list[tuple[str, Any, str]] = [
    ("files", [], "files: expected a mapping"),
    ("files", {"a": {"sha256": "0" * 64, "size": "1"}}, "files.a.size: expected an integer >= 0"),
    ("files", {"a": {"sha256": "0" * 64, "size": -1}}, "files.a.size: expected an integer >= 0"),
    ("files", {"a": {"sha256": "0" * 64, "size": True}}, "files.a.size: expected an integer >= 0"),
    ("files", {"a": {"sha256": "xyz", "size": 1}}, "files.a.sha256: expected a sha256"),
    ("files", {"a": {"size": 1}}, "files.a.sha256: missing required key"),
    ("files", {"a": {"sha256": "0" * 64, "size": 1, "mode": 7}}, "files.a.mode: unknown key"),
    ("files", {"a\nb": {"sha256": "0" * 64, "size": 1}}, "control character"),
    ("bases", {KEY: 5}, f"bases.{KEY}: expected a path relative to the mirror"),
    ("bases", {"not-a-key": "bases/x.tar"}, "bases.not-a-key: expected a base content key"),
    ("images", {"img": "x"}, "images.img: expected an image entry"),
    ("images", {"Bad Name": {"lock_sha256": KEY, "base": KEY}}, "images.Bad Name: expected a name"),
    ("packages", {"p": {"1": {"file": "d.deb", "in_base": KEY}}}, "expected exactly one of file, in_base"),
    ("packages", {"p": {"1": {}}}, "expected exactly one of file, in_base"),
    ("packages", {"p": {"1": {"file": "d.deb", "sha256_from": "guess"}}}, "packages.p.1.sha256_from: expected one of"),
    ("packages", {"p": {"1": {"in_base": KEY}}}, f"packages.p.1: in_base {KEY[:12]} is not among the index's bases"),
    ("packages", {"p": {"1": {"file": "d.deb"}}}, "packages.p.1: the package's file 'd.deb' is not among"),
    ("packages", {"p": ["1"]}, "packages.p: expected a mapping"),
    ("wheels", {"w": {"1": {"file": "w.whl", "sha256": KEY}}}, "wheels.w.1: the wheel's file 'w.whl' is not among"),
    ("wheels", {"w": {"1": {"file": "w.whl"}}}, "wheels.w.1.sha256: missing required key"),
    ("surprise", {}, "surprise: unknown key"),
    ("format", 2, "is not a nodeforge mirror index of format 1"),
    ("format", "1", "is not a nodeforge mirror index of format 1"),
]


@pytest.mark.parametrize("section, value, message", SHAPES)
def test_a_wrong_shape_names_its_key(tmp_path: Path, plan: BuildPlan, section: str, value: Any,
                                     message: str) -> None:
    root = _mirror(tmp_path, plan)
    doc = _doc(plan, {f"bases/{plan.base.key}.tar": BASE})
    doc[section] = value
    _write(root, doc)
    text = _refused(root)
    assert message in text and "Traceback" not in text
    assert "nodeforge mirror IMAGE... DIR" in text or "fix: known keys" in text  # a remedy


@pytest.mark.parametrize("text", ["", "[]", "{\"format\": 1", "{\"format\": NaN}", "[" * 100000, "\"\\ud800\""])
def test_an_index_that_is_not_an_index_is_refused(tmp_path: Path, text: str) -> None:
    root = tmp_path / "mirror"
    root.mkdir()
    (root / mirror_index.INDEX).write_text(text)
    assert "nodeforge mirror" in _refused(root)


def test_a_wheel_whose_sha256_differs_from_its_file_is_refused(tmp_path: Path, plan: BuildPlan) -> None:
    files = {f"bases/{plan.base.key}.tar": BASE, "wheels/w-1-py3-none-any.whl": b"wheel"}
    doc = _doc(plan, files)
    doc["wheels"] = {"w": {"1": {"file": "wheels/w-1-py3-none-any.whl", "sha256": "1" * 64}}}
    root = _mirror(tmp_path, plan, files, doc)
    assert f"wheels.w.1: sha256 {'1' * 64} differs from its file's {_sha(b'wheel')}" in _refused(root)


# --- low items: `nodeforge mirror` writes whole or not at all ---------------------------------------

def _fake_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "cache" / "base.tar"
    src.parent.mkdir()
    src.write_bytes(b"x" * 3_000_000)
    monkeypatch.setattr(gather.bootstrap, "tarball", lambda base, progress, image: src)
    return src


def test_a_full_disk_names_the_destination_and_the_space_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_base(tmp_path, monkeypatch)

    def full(a: str, b: str, **kw: Any) -> None:  # what shutil raises: the source in filename
        raise OSError(errno.ENOSPC, "No space left on device", str(a), None, str(b))

    monkeypatch.setattr(gather.shutil, "copyfile", full)
    (tmp_path / "out").mkdir()
    dest = tmp_path / "out" / "mirror"
    assert main(["--root", str(ROOT), "mirror", IMAGE, str(dest)]) == 1
    err = capsys.readouterr().err
    assert f"mirror {dest}: no space left on the device of {(tmp_path / 'out').resolve()}" in err
    assert "copying base.tar into it" in err and "the mirror needs more than 3 MB there" in err
    assert f"writing {src}" not in err
    assert not dest.exists() and not (tmp_path / "out" / "mirror.tmp").exists()


def test_an_interrupted_mirror_leaves_the_old_one_as_it_was(tmp_path: Path, plan: BuildPlan,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_base(tmp_path, monkeypatch)
    dest = _mirror(tmp_path, plan)
    before = (dest / mirror_index.INDEX).read_bytes()

    def interrupted(a: str, b: str, **kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(gather.shutil, "copyfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gather.mirror(load_tree(ROOT), [IMAGE], None, [], dest, Progress(quiet=True))
    assert (dest / mirror_index.INDEX).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "mirror"]


def test_a_directory_named_like_the_mirrors_temporary_one_is_not_removed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out.tmp").mkdir()
    (tmp_path / "out.tmp" / "keep").write_text("mine")
    assert main(["--root", str(ROOT), "mirror", IMAGE, str(tmp_path / "out")]) == 2
    assert "is not what an earlier `nodeforge mirror` left" in capsys.readouterr().err
    assert (tmp_path / "out.tmp" / "keep").read_text() == "mine"


WRITE_UNDER_A_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from builder.mirror.index import Index
idx = Index(files={f"debs/p{i}.deb": {"sha256": "0" * 64, "size": i} for i in range(200)})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    idx.write(Path(sys.argv[1]))
except OSError as e:
    print("write failed:", e.strerror)
"""


def test_a_failed_index_write_leaves_the_old_index_whole(tmp_path: Path) -> None:
    """The write fails past 4 KiB (a file size limit stands in for a full disk): the old index is
    still there, whole, and no temporary file is left in the mirror."""
    root = tmp_path / "mirror"
    root.mkdir()
    mirror_index.Index(files={"a": {"sha256": "0" * 64, "size": 0}}).write(root)
    before = (root / mirror_index.INDEX).read_bytes()
    done = subprocess.run([sys.executable, "-c", WRITE_UNDER_A_SIZE_LIMIT, str(root)], capture_output=True,
                          text=True, cwd=ROOT)
    assert "write failed" in done.stdout, done.stdout + done.stderr
    assert (root / mirror_index.INDEX).read_bytes() == before
    assert os.listdir(root) == [mirror_index.INDEX]


# --- the other JSON the engine stage reads ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "list", "deep", "directory"])
def test_an_odd_build_state_is_ignored_not_waited_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     kind: str) -> None:
    monkeypatch.setenv("NODEFORGE_BUILD_DIR", str(tmp_path / "build"))
    path = tmp_path / "build" / "state" / "img.json"
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text("[1, 2]" if kind == "list" else "[" * 100000 + "]" * 100000)
    start = time.monotonic()
    state = cache.State(tmp_path, "img")
    assert state.old == {} and state.previous("layer") is None
    assert time.monotonic() - start < 5  # not waited on (the guard's TimeoutError is an OSError: not enough)


def test_a_deeply_nested_sets_label_is_read_as_no_sets() -> None:
    rec = recorded.recorded({recorded.KEY_LABEL: "k", recorded.SETS_LABEL: "[" * 100000 + "]" * 100000})
    assert rec is not None and rec.sets == ()


# --- fuzz: random indexes over random trees (Hypothesis, in the style of tests/test_fuzz.py) ---------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_EXAMPLES = 40
SEGMENTS = ["a", "b", "bases", "debs", "x.tar", "k.deb", "..", ".", "", " ", "a\nb", "é", "nodeforge-mirror.json"]
TREE_PATHS = st.lists(st.sampled_from(SEGMENTS[:6]), min_size=1, max_size=3).map("/".join)
REL_PATHS = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map("/".join) | st.text(max_size=12)
KINDS = ["file", "file", "fifo", "link-out", "link-in", "dir"]
JSON_LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10**30) | st.floats()
               | st.text(max_size=20) | st.sampled_from(["0" * 64, "f" * 64, "../x.tar", "/etc/passwd", "lock"]))
JSON = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8) | REL_PATHS, inner, max_size=3), max_leaves=20)
SECTIONS = ["format", "images", "bases", "packages", "wheels", "files", "other"]


def _make_tree(root: Path, entries: list[tuple[str, str, bytes]]) -> dict[str, bytes]:
    """The entries under root, where they can be made inside it; what was made, by path, with the
    bytes an index would list for it (a FIFO, a link or a directory listed as the bytes given)."""
    made: dict[str, bytes] = {}
    for rel, kind, data in entries:
        parts = rel.split("/")
        if not rel or "\0" in rel or any(p in ("", ".", "..") for p in parts) or parts[0] == mirror_index.INDEX:
            continue  # outside the mirror, or the index itself (a FIFO there has a test of its own above)
        path = root / rel
        if os.path.lexists(path):  # a path given twice: writing "a file" into the FIFO made first would block
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "file":
                path.write_bytes(data)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "link-out":
                path.symlink_to("/etc")
            elif kind == "link-in":
                path.symlink_to(root / mirror_index.INDEX)
            else:
                path.mkdir()
        except (OSError, ValueError):
            continue
        made[rel] = data
    return made


def _fuzz_doc(plan: BuildPlan, made: dict[str, bytes], changes: list[tuple[str, Any, Any]],
              rels: list[str]) -> dict[str, Any]:
    """An index of the files made, then changed: a section replaced, a key added, a path listed."""
    doc = _doc(plan, {**made, f"bases/{plan.base.key}.tar": BASE})
    for i, (section, key, value) in enumerate(changes):
        if section == "files" and rels:
            doc["files"][rels[i % len(rels)]] = value if isinstance(value, dict) else {"sha256": "0" * 64, "size": 0}
        elif section == "bases" and rels:
            doc["bases"][plan.base.key] = rels[i % len(rels)]
        elif section in doc and isinstance(doc[section], dict) and isinstance(key, str):
            doc[section][key] = value
        else:
            doc[section] = value
    return doc


def _run_guarded(root: Path, plan: BuildPlan) -> None:
    """check() and the offline build's mirror step: a UsageError or nothing, within the guard."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(GUARD_SECONDS)
    try:
        mirror_index.check(root)
        _prepare(root, plan)
    except UsageError:
        pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(entries=st.lists(st.tuples(TREE_PATHS | REL_PATHS, st.sampled_from(KINDS), st.binary(max_size=64)),
                       max_size=8),
       changes=st.lists(st.tuples(st.sampled_from(SECTIONS), st.text(max_size=8) | REL_PATHS, JSON), max_size=4),
       rels=st.lists(REL_PATHS, max_size=3), raw=st.none() | st.binary(max_size=200))
def test_a_random_index_over_a_random_tree_only_ever_gives_a_usage_error(
        plan: BuildPlan, tmp_path_factory: pytest.TempPathFactory, entries: list[tuple[str, str, bytes]],
        changes: list[tuple[str, Any, Any]], rels: list[str], raw: bytes | None) -> None:
    root = tmp_path_factory.mktemp("fuzz") / "mirror"
    root.mkdir()
    base = root / "bases" / f"{plan.base.key}.tar"
    base.parent.mkdir()
    base.write_bytes(BASE)
    made = _make_tree(root, entries)
    if raw is not None:
        (root / mirror_index.INDEX).write_bytes(raw)
    else:
        (root / mirror_index.INDEX).write_text(json.dumps(_fuzz_doc(plan, made, changes, rels)))
    _run_guarded(root, plan)  # any other exception, or a hang, fails the example


@FUZZ
@given(entries=st.lists(st.tuples(TREE_PATHS, st.sampled_from(KINDS), st.binary(max_size=64)), min_size=1,
                        max_size=8),
       sizes=st.lists(st.integers(min_value=0, max_value=70), max_size=3))
def test_a_random_tree_under_a_well_formed_index_only_ever_gives_a_usage_error(
        plan: BuildPlan, tmp_path_factory: pytest.TempPathFactory, entries: list[tuple[str, str, bytes]],
        sizes: list[int]) -> None:
    """The index is well formed and lists everything in the tree (FIFOs, links and directories
    too, some with another size): only the file checks can refuse it."""
    root = tmp_path_factory.mktemp("fuzz") / "mirror"
    base = root / "bases" / f"{plan.base.key}.tar"
    base.parent.mkdir(parents=True)
    base.write_bytes(BASE)
    made = _make_tree(root, entries)
    doc = _doc(plan, {**made, f"bases/{plan.base.key}.tar": BASE})
    for rel, size in zip(sorted(made), sizes, strict=False):
        doc["files"][rel]["size"] = size
    (root / mirror_index.INDEX).write_text(json.dumps(doc))
    _run_guarded(root, plan)
