"""Stopping a build on Ctrl-C or SIGTERM. The signal sets one flag that the workers check where they
wait or begin something (the build lock, each step, each container they create); what a worker made
and removes on its way out (its temporary directories, its overlay mounts) is registered here as
well, so that the command line can remove it when a worker does not get there in time (it is in an
engine call that only the end of the process ends: the engine then stops that build and removes
its container). The containers go with engine.client; a process killed outright (SIGKILL) leaves
its things to the next build (node.assemble.remove_strays, engine.client.remove_orphans)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

CANCELLED = threading.Event()
GRACE_SECONDS = 3.0  # how long the workers get to stop on their own after an interrupt

_scratch: dict[int, tuple[str, Path]] = {}  # token -> (dir | mount, path), in order of registration
_scratch_lock = threading.Lock()
_tokens = itertools.count()


class Cancelled(KeyboardInterrupt):
    """Raised in a worker once the build is stopped: it unwinds like Ctrl-C (no `except Exception`
    catches it) and runs the worker's own clean-up on the way."""


def check() -> None:
    if CANCELLED.is_set():
        raise Cancelled()


def pause(seconds: float) -> None:
    """Sleep, or raise Cancelled as soon as the build is stopped."""
    if CANCELLED.wait(seconds):
        raise Cancelled()


@contextlib.contextmanager
def scratch(path: Path, kind: str = "dir") -> Iterator[Path]:
    """path (a directory of this process's, or a mount point when kind is "mount") is removed
    (unmounted) by remove_scratch if the code that made it has not finished with it by then."""
    token = register(path, kind)
    try:
        yield path
    finally:
        unregister(token)


def register(path: Path, kind: str = "dir") -> int:
    with _scratch_lock:
        token = next(_tokens)
        _scratch[token] = (kind, path)
    return token


def unregister(token: int) -> None:
    with _scratch_lock:
        _scratch.pop(token, None)


def unmount(target: Path) -> bool:
    """Unmount target (lazily when it is busy); True when it is no longer a mount point."""
    if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)
    return not os.path.ismount(target)


def remove_scratch() -> list[str]:
    """Unmount every registered mount (newest first), then remove every registered directory; what
    was removed. Called once the workers had their chance to do it themselves."""
    with _scratch_lock:
        items = list(reversed(_scratch.values()))
        _scratch.clear()
    done = []
    for kind, path in sorted(items, key=lambda item: item[0] != "mount"):  # the mounts first
        if kind == "mount":
            if os.path.ismount(path) and unmount(path):
                done.append(str(path))
        elif path.exists():
            shutil.rmtree(path, ignore_errors=True)
            done.append(str(path))
    return done


def stop_children() -> None:
    """SIGTERM to this process's own child processes (tar, mkfs, qemu, mmdebstrap ...): a worker
    waiting for one returns. A Ctrl-C on a terminal reaches them anyway; `kill -INT` does not."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == me:
                os.kill(int(stat.parent.name), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue


def _workers() -> list[threading.Thread]:
    """The build's threads (named nodeforge-*: its pools and helpers) that still run."""
    return [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon
            and t.is_alive() and t.name.startswith("nodeforge")]


def wind_down(seconds: float) -> bool:
    """Wait up to seconds for the build's threads to end; whether they all did."""
    deadline = time.monotonic() + seconds
    for t in _workers():
        t.join(max(0.0, deadline - time.monotonic()))
    return not _workers()


def interrupted(remove_containers: Callable[[], list[str]]) -> int:
    """After Ctrl-C or SIGTERM reached the main thread: the workers stopped (their child processes
    ended, a grace period), what they left removed, one line said; exit code 2. A worker still
    blocked in an engine call does not keep the process: it ends here, and the engine stops that call."""
    CANCELLED.set()
    with _held_signals():  # a second Ctrl-C does not cut the clean-up short
        if _workers():  # a build is under way (in threads): the processes it started end too
            stop_children()
        finished = wind_down(GRACE_SECONDS)
        remove_scratch()
        removed = remove_containers()
    print("interrupted" + (f"; removed containers {' '.join(removed)}" if removed else ""), file=sys.stderr)
    if not finished:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    CANCELLED.clear()  # every worker has ended: a later build in this process starts afresh
    return 2


@contextlib.contextmanager
def _held_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM stop the build: the flag is set at once (the workers see it while the
    main thread unwinds) and KeyboardInterrupt is raised in the main thread. Outside the main
    thread (an embedding program) nothing is installed."""
    CANCELLED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        CANCELLED.set()
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
