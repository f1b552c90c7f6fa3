"""The rollout manifest of a build (build/images/<image>/manifest.json), its in-toto / SLSA
provenance statement, and the comparison of two manifests that `nodeforge diff` prints."""
