"""Small definition trees written by tests, and `nodeforge` run on one.

- NODE_IMAGE: a node image on Debian whose layer list is LAYERS (replace it).
- SITE_LAYER: a site layer, site-motd, with one parameter (text) written into /etc/site-motd.
- `scratch_image(name, summary, layers)`: an image on Debian bookworm (every component), tagged
  nodeforge/NAME:VERSION; a layer is a name or a layer with its parameters ({name: {param: value}}).
- `tree_with_layers(tmp, layers, images, configs)`: tmp/tree holding copies of the repository's
  layers named and the images and configs given (name: YAML text); by default one config, default.
- `nodeforge(tree, *args)`: the command line run on a tree, its output captured.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent

NODE_IMAGE = """name: img
summary: an image
kind: node
version: "1"
from: {debian: {suite: bookworm}}
source-date-epoch: 1700000000
layers: [LAYERS]
"""

SITE_LAYER = """\
name: site-motd
summary: a site's message of the day
applies-to: [container, node]
requires: [base]
params:
  text: {type: str, default: "welcome", doc: the message}
files:
  - {path: /etc/site-motd, content: "{{ text }}\\n"}
"""

DEFAULT_CONFIGS = {"default": "name: default\nsummary: defaults\n"}


def scratch_image(name: str, summary: str, layers: Sequence[str | Mapping[str, Any]], *, kind: str = "node",
                  version: str = "0.0.1", tag: str | None = None) -> str:
    """The image's YAML text: on Debian bookworm with every component, source date 2025-01-01,
    tagged `tag` (nodeforge/NAME:VERSION unless given)."""
    items = "".join(f"  - {_item(layer)}\n" for layer in layers)
    return (f'name: {name}\nsummary: {summary}\nkind: {kind}\nversion: "{version}"\nfrom:\n'
            "  debian: {suite: bookworm, components: [main, contrib, non-free, non-free-firmware]}\n"
            f"source-date-epoch: 1735689600\nlayers:\n{items}"
            f"outputs:\n  tags: [{tag or f'nodeforge/{name}:{version}'}]\n")


def _item(layer: str | Mapping[str, Any]) -> str:
    if isinstance(layer, str):
        return layer
    return yaml.safe_dump(dict(layer), default_flow_style=True, sort_keys=False, width=1 << 16).strip()


def tree_with_layers(tmp: Path, layers: Iterable[str], images: Mapping[str, str],
                     configs: Mapping[str, str] = DEFAULT_CONFIGS) -> Path:
    """tmp/tree: copies of the repository's layers named, and images/NAME.yaml and configs/NAME.yaml
    holding the texts given."""
    tree = tmp / "tree"
    for layer in layers:
        shutil.copytree(ROOT / "layers" / layer, tree / "layers" / layer)
    for folder, documents in (("images", images), ("configs", configs)):
        (tree / folder).mkdir()
        for name, text in documents.items():
            (tree / folder / f"{name}.yaml").write_text(text)
    return tree


def nodeforge(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`nodeforge --root TREE ARGS...` from the repository's root, its output captured."""
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
