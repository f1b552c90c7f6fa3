"""What the end of every build writes: manifest.json and provenance.intoto.json beside the
image's outputs, each written whole (a temporary file renamed into place); the manifest it
replaces kept in history/ (manifest.history)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from .. import lockfile
from ..compose.image import output_name
from ..definitions.load import Tree
from ..node.assemble import NodeArtifacts
from ..plan import BuildPlan
from . import document, history, provenance
from .image_digest import Digests


def write(tree: Tree, plan: BuildPlan, digests: Digests, labels: dict[str, str],
          node: NodeArtifacts | None, resolved: Mapping[str, lockfile.Lock] | None = None) -> Path:
    """Write the manifest and its provenance statement (in build/images/NAME[@CONFIG]/, with the
    image's other outputs); the manifest's path. resolved: the build's own resolutions by lock name
    (pipeline.Builder.resolved), recorded where the build used them."""
    doc = document.document(tree, plan, digests, labels, node, resolved)
    data = document.dumps(doc)
    path = document.path_for(tree.root, output_name(plan))
    history.rotate(path, data)
    document.write_atomically(path, data)
    stmt = provenance.statement(doc, path.name, hashlib.sha256(data).hexdigest())
    document.write_atomically(path.with_name(provenance.NAME), document.dumps(stmt))
    return path
