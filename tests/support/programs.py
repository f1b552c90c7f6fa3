"""Loading a node program (layers/*/files, with or without .py) as a module, to call its functions.

    health = load_program(ROOT / "layers/gpu-health/files/gpu-health.py")
    health.RULES, health.main(["--json", ...])

The program's directory and the node library (layers/node-lib/files) are put on sys.path first, as
they are on a node (the program's own modules beside it, the library in dist-packages). The module is
registered in sys.modules under a name made from the file name (dataclasses look it up while it loads);
loading the same path again returns the module already loaded. No bytecode is written beside the
layers' files.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from support.fake_tools import NODE_LIB


def load_program(path: Path) -> ModuleType:
    name = "nodeforge_program_" + re.sub(r"\W", "_", path.name.removesuffix(".py"))
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    for folder in (str(path.parent), str(NODE_LIB)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    if spec is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[name] = module
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in layers/
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module
