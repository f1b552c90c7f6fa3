"""The build directory and the engine repositories can be moved per build (read at call time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import paths
from builder.engine import bootstrap, steps
from builder.errors import EnvironmentProblem


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(paths.BUILD_DIR_VARIABLE, raising=False)
    monkeypatch.delenv(paths.NAMESPACE_VARIABLE, raising=False)
    assert paths.build_dir(tmp_path) == tmp_path / "build"
    assert (paths.cache_repo(), paths.base_repo()) == ("nodeforge-cache", "nodeforge-base")
    assert steps.step_ref("k1") == "nodeforge-cache:k1"


def test_moved_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(paths.BUILD_DIR_VARIABLE, str(tmp_path / "elsewhere"))
    monkeypatch.setenv(paths.NAMESPACE_VARIABLE, "repro-a")
    assert paths.build_dir(Path("/project")) == tmp_path / "elsewhere"
    assert steps.step_ref("k1") == "nodeforge-cache-repro-a:k1"
    assert bootstrap.base_repo() == "nodeforge-base-repro-a"


@pytest.mark.parametrize("bad", ["Upper", "a b", "-x", "x/y", "a" * 65, "a:b"])
def test_a_namespace_must_fit_a_repository_name(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(paths.NAMESPACE_VARIABLE, bad)
    with pytest.raises(EnvironmentProblem, match="NODEFORGE_CACHE_NAMESPACE"):
        paths.cache_repo()
