"""Shared test support: fake tools, program loading, the offline-sources server. Not a test module."""
