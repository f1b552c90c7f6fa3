"""Exports of a build to other tools (Packer)."""
