"""Errors a user can act on: where (file, line, key path), what was expected, what was found, what to do."""

from __future__ import annotations

from dataclasses import dataclass, field

from .escaping import for_terminal

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    path: str
    message: str
    remedy: str = ""
    lint: str = ""

    def render(self) -> str:
        """Two lines at most (the problem, then its fix), each printable: a value quoted into the
        message (a file name, a key, what was found) cannot move the cursor or start a line."""
        t = for_terminal
        where = t(self.file) + (f":{self.line}" if self.line else "")
        key = f" {t(self.path)}:" if self.path else ""
        tag = f" [{t(self.lint)}]" if self.lint else ""
        text = f"{where}:{key} {t(self.message)}{tag}"
        if self.remedy:
            text += f"\n    fix: {t(self.remedy)}"
        return text


class NodeforgeError(Exception):
    """A user error: bad input or an unusable environment. Exit code 2, never a traceback."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []

    def render(self) -> str:
        message = "\n".join(for_terminal(line) for line in str(self).split("\n"))
        if not self.problems:
            return f"error: {message}"
        head = f"error: {message}" if message else "error:"
        return "\n".join([head, *(p.render() for p in self.problems)])


class DefinitionError(NodeforgeError):
    """One or more problems in layer, image or config definitions."""

    def __init__(self, problems: list[Problem]) -> None:
        n = len(problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the definitions", problems)


class EnvironmentProblem(NodeforgeError):
    """The machine lacks something nodeforge needs (engine, tool, network)."""


class BuildFailed(NodeforgeError):
    exit_code = EXIT_FAIL


@dataclass
class Collector:
    """Gathers problems so a user sees all of them at once, KIWI-style."""

    problems: list[Problem] = field(default_factory=list)

    def add(self, file: str, line: int | None, path: str, message: str, remedy: str = "",
            lint: str = "") -> None:
        self.problems.append(Problem(file, line, path, message, remedy, lint))

    def raise_if_any(self) -> None:
        if self.problems:
            raise DefinitionError(self.problems)


class UsageError(NodeforgeError):
    """A command line that cannot be carried out as given."""
