"""Exports of a build to other tools: a Packer template and normalised OCI layouts (the
reproducibility comparison lives in builder/repro/)."""
