"""What a definition may reach on the build host. Definitions are untrusted, and git stores
symbolic links: a layer directory or a files/ that is a link, a definition file that leads out of
the project tree or a file under files/ whose links lead out of it would let `render` and `build`
copy any file of the build host (/etc/shadow) into an image. The real path of everything a layer
copies stays under <root>/layers/<name>/files; links inside files/ that stay inside it are fine."""

from __future__ import annotations

from pathlib import Path


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def link_problem(root: Path, path: Path, what: str) -> str:
    """'' when path is no symbolic link, else why it is refused. Git stores links: a layer directory
    or a files/ that is one would let a definition read any file of the build host into the image."""
    if not path.is_symlink():
        return ""
    return (f"expected {what}, found a symbolic link {rel(root, path)} -> {str(path.readlink())!r} "
            "(a link would let a definition read files from outside the project tree)")


def outside_root(root: Path, path: Path) -> str:
    """'' when path's real path (symlinks resolved) is inside the project tree, else why not."""
    real = path.resolve()
    if real.is_relative_to(root):
        return ""
    return (f"expected a definition file inside the project tree, found {rel(root, path)} leading to "
            f"{str(real)!r} outside it")


def inside_files(root: Path, layer_dir: Path, name: str, what: str) -> str:
    """'' when files/<name> is a regular file inside files/ with every symlink resolved, else why not.
    A symlink that leads out (to /etc/passwd, say) would copy a file of the build host into the image."""
    files = layer_dir / "files"  # layer_dir is <root>/layers/<name>, the root's real path
    real = files.resolve()
    if real != files:
        return (f"expected {what} under {rel(root, files)}/, found that directory leading to {str(real)!r} "
                "(a symbolic link on the way)")
    path = (files / name).resolve()
    if not path.is_relative_to(files):
        return f"expected {what} inside the layer's files/, found {name!r} leading to {str(path)!r} outside it"
    if not path.is_file():
        return f"expected {what} under {rel(root, layer_dir / 'files')}/, found no {name!r}"
    return ""
