"""The command line's commands: declared once in table.COMMANDS, run by the runner modules here
(definitions, build, verify, ship, compare), each given one Invocation."""
