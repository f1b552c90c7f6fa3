"""Stages 3 to 5: everything that speaks the Docker API (client, package resolution, bootstrap, step
builds including the initramfs step, cache fingerprints, labels, SBOM)."""
