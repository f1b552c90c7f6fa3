"""Sources the build host holds: a `file:` URL given to a url-or-file parameter on the command line
names a directory on the build host (a vendor's .deb files with a SHA256SUMS list, where the
vendor's repository cannot be reached).

The step that reads it sees the directory read-only at MOUNT, a bind mount of the build host's
directory (engine.offline.source_step): nothing of it is copied into a layer, and the rendered
script says file:MOUNT/, the same on every build host. What the step's key takes from the source is
the sha256 of its SHA256SUMS, which lists the sha256 of every file the step may read: two hosts
with the same files share the key, and a changed file changes it. The step itself checks each .deb
against the list (vendor-debs).

Only the command line can name one: a definition (a layer default, an image, a config) may come
from another team or a pull request, and must not make the build host's files visible to a build
step."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..definitions.load import Layer
from ..errors import Collector
from ..plan import HostSource
from .params import Setting

MOUNT = "/media"  # in every Debian root (base-files) and empty: a bind mount there leaves nothing in a commit
SUMS = "SHA256SUMS"


def of_layer(layer: Layer, settings: dict[str, Setting], out: Collector
             ) -> tuple[dict[str, str], tuple[HostSource, ...]]:
    """The layer's parameters that name a host directory: the values its templates see instead
    (file:MOUNT/) and the sources its step mounts."""
    seen: dict[str, str] = {}
    found: list[HostSource] = []
    for pname, param in layer.params.items():
        setting = settings.get(pname)
        value = setting.value if setting else None
        if param.type != "url-or-file" or not isinstance(value, str) or not value.startswith("file:"):
            continue
        key = f"{layer.name}.{pname}"
        assert setting is not None
        if not setting.source.startswith("--set "):
            out.add(layer.file, layer.line("params", pname), key,
                    f"a file: source is a directory on the build host, and {setting.source} names {value}",
                    f"give a build-host directory on the command line: --set {key}={value} (a definition "
                    "cannot make the build host's files visible to a build step); a definition uses an "
                    "http(s) source")
            continue
        if found:
            out.add("command line", None, key, f"a second build-host source for layer {layer.name} "
                    f"(it has {found[0].param}): a layer's step sees one build-host directory",
                    "put both sets of files into one directory with one SHA256SUMS, or serve one over http(s)")
            continue
        directory = Path(value[len("file:"):])
        sums = directory / SUMS
        if set(str(directory)) & set(":,"):  # the engine's bind syntax is HOST:TARGET:MODE
            out.add("command line", None, key, f"the build-host source {directory} has a ':' or ',' in its path",
                    "move or link the directory to a path without ':' and ','")
            continue
        if not directory.is_dir() or not sums.is_file():
            what = "is not a directory" if not directory.is_dir() else f"has no {SUMS} file"
            out.add("command line", None, key, f"the build-host source {directory} {what}",
                    f"give a directory holding the .deb files and a {SUMS} file listing them "
                    f"(sha256sum *.deb > {SUMS} where they are)")
            continue
        found.append(HostSource(key, str(directory.resolve()), hashlib.sha256(sums.read_bytes()).hexdigest(), MOUNT))
        seen[pname] = f"file:{MOUNT}/"
    return seen, tuple(found)
