"""What the end of every build writes: manifest.json and provenance.intoto.json beside the
image's outputs, each written whole (a temporary file renamed into place)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..definitions.load import Tree
from ..node.assemble import NodeArtifacts
from ..plan import BuildPlan
from . import document, provenance
from .image_digest import Digests


def write(tree: Tree, plan: BuildPlan, digests: Digests, labels: dict[str, str],
          node: NodeArtifacts | None) -> Path:
    """Write the manifest and its provenance statement; the manifest's path."""
    doc = document.document(tree, plan, digests, labels, node)
    data = document.dumps(doc)
    path = document.path_for(tree.root, plan.image)
    document.write_atomically(path, data)
    stmt = provenance.statement(doc, path.name, hashlib.sha256(data).hexdigest())
    document.write_atomically(path.with_name(provenance.NAME), document.dumps(stmt))
    return path
