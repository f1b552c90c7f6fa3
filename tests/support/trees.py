"""Small definition trees written by tests: a node image on Debian whose layer list is LAYERS."""

from __future__ import annotations

NODE_IMAGE = """name: img
summary: an image
kind: node
version: "1"
from: {debian: {suite: bookworm}}
source-date-epoch: 1700000000
layers: [LAYERS]
"""
