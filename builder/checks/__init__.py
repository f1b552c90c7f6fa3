"""Named semantic checks: kernel arguments, sysctl keys, root-file-system hygiene, and their registry."""
