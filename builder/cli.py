"""The nodeforge command line: the parser, built from the command table (builder/commands/table.py),
and the exits. Exit codes: 0 ok, 1 a build or a test failed, 2 usage, definition or environment error
(never a traceback)."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable

from .commands.invocation import Invocation
from .commands.table import COMMANDS, PARENTS, Command
from .engine import cancel
from .errors import EXIT_FAIL, NodeforgeError

Subparsers = argparse._SubParsersAction


def parser(commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodeforge", description="Build, verify and publish GPU node images and "
                                "CUDA container base images from layered definitions.")
    p.add_argument("--root", default=None, help="project tree (default: from the image path, else .)")
    sub = p.add_subparsers(dest="command", required=True)
    parents: dict[str, Subparsers] = {}
    for cmd in commands:
        verb, _, sub_verb = cmd.name.partition(" ")
        if sub_verb and verb not in parents:  # `export packer`: the sub-verb is chosen under `export`
            group = sub.add_parser(verb, help=PARENTS.get(verb))
            parents[verb] = group.add_subparsers(dest="format", required=True)
        sp = (parents[verb] if sub_verb else sub).add_parser(sub_verb or verb, help=cmd.help)
        for a in cmd.args:
            a.add(sp)
        sp.set_defaults(run=cmd)
    return p


def runner(cmd: Command) -> Callable[[Invocation], int]:
    """The command's function, imported now that it runs."""
    module, _, function = cmd.runner.partition(":")
    run: Callable[[Invocation], int] = getattr(importlib.import_module(module), function)
    return run


def main(argv: list[str] | None = None, commands: tuple[Command, ...] = COMMANDS) -> int:
    args = parser(commands).parse_args(argv)
    inv = Invocation(args.run, args)
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        with cancel.on_signals():  # Ctrl-C and SIGTERM stop the build
            run = runner(inv.command)
            inv.meet_needs()
            return int(run(inv))
    except NodeforgeError as e:
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        client_module = sys.modules.get("builder.engine.client")  # the containers this process created
        return cancel.interrupted(client_module.remove_throwaway_containers if client_module else list)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        return _fault(e)


def _fault(e: Exception) -> int:
    """An engine call that failed (exit 2, naming the call and the engine), a full disk (exit 1); else a bug."""
    client_module = sys.modules.get("builder.engine.client")  # loaded wherever the engine was spoken to
    problem = client_module.engine_problem(e) if client_module else None
    if problem is not None:
        print(problem.render(), file=sys.stderr)
        return int(problem.exit_code)
    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise e
    where = f" writing {e.filename}" if e.filename else ""
    print(f"error: no space left on the device{where}: nothing was published as complete (partial "
          "outputs were removed); free space (docker system prune, build/) and run it again", file=sys.stderr)
    return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
