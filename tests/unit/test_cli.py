"""The command line's exits: a closed pipe is quiet (`nodeforge schema | head`), a full disk is a
clear error, anything else propagates."""

from __future__ import annotations

import errno

import pytest

from builder import cli
from builder.commands import definitions
from builder.commands.invocation import Invocation


def raising(exc: BaseException) -> object:
    def command(inv: Invocation) -> int:
        raise exc
    return command


def test_a_closed_pipe_exits_0_quietly(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(definitions, "schema", raising(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert cli.main(["schema", "layer"]) == 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_full_disk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(definitions, "schema", raising(OSError(errno.ENOSPC, "No space left", "/build/x")))
    assert cli.main(["schema", "layer"]) == 1
    assert "no space left on the device writing /build/x" in capsys.readouterr().err


def test_another_os_error_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(definitions, "schema", raising(PermissionError(errno.EACCES, "denied")))
    with pytest.raises(PermissionError):
        cli.main(["schema", "layer"])
