"""Shared test support: fake tools, program loading, the offline-sources server, small definition trees
and the command run on them, builds in an engine namespace of their own, promtool's metrics check. Not a
test module."""
