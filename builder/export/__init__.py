"""Exports of a build to other tools (Packer, normalised OCI layouts) and the comparison of two builds."""
