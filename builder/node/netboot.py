"""Netboot artifacts of a node image: the root archive and the iPXE script that boots the kernel
and initramfs with it (boot=nodeforge-net: the initramfs fetches the archive into RAM)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..definitions.quoting import Unquotable, cmdline_args, ipxe_word
from ..errors import BuildFailed

if TYPE_CHECKING:
    from .artifacts import NodeArtifacts

def ipxe_script(art: NodeArtifacts, image: str, version: str, root_sha256: str) -> str:
    # iPXE has no quoting: every argument must be one word without ${ (ipxe_word refuses the rest)
    try:
        cmdline = " ".join(ipxe_word(a) for a in cmdline_args(art.cmdline) if not a.startswith("root=") and a != "ro")
    except Unquotable as e:
        raise BuildFailed(f"netboot of {image}: {e}; drop that kernel argument or the netboot format") from None
    return "\n".join([
        "#!ipxe",
        f"# nodeforge {' '.join(image.split())} {' '.join(version.split())} (assembly {art.key[:12]}): "
        "stateless netboot, root in RAM.",
        "# Serve this directory over HTTP and chain this script; base-url defaults to where it came from.",
        "isset ${base-url} || set base-url ${cwduri}",
        f"kernel ${{base-url}}/{art.files['kernel']} initrd={art.files['initrd']} {cmdline} boot=nodeforge-net "
        f"nodeforge.root=${{base-url}}/{art.files['rootfs']} nodeforge.root_sha256={root_sha256} ip=dhcp",
        f"initrd ${{base-url}}/{art.files['initrd']}",
        "boot", ""])
