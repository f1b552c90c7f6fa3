"""Stage 6, node images: assembly of disks and netboot artifacts from a built image."""
