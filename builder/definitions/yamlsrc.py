"""YAML with positions: every mapping and list remembers the line of each of its keys and items.

Duplicate keys are errors (PyYAML silently keeps the last one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import DefinitionError, Problem


class Located:
    file: str
    line: int
    key_lines: dict[Any, int]


class LDict(dict, Located):  # type: ignore[type-arg,unused-ignore]
    pass


class LList(list, Located):  # type: ignore[type-arg,unused-ignore]
    pass


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first


def _loader(file: str) -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LDict:
        loader.flatten_mapping(node)
        out = LDict()
        out.file, out.line, out.key_lines = file, node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in out.key_lines:
                raise _DuplicateKey(key, line, out.key_lines[key])
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_lines[key] = line
        return out

    def construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> LList:
        out = LList(loader.construct_object(child, deep=True) for child in node.value)
        out.file, out.line = file, node.start_mark.line + 1
        out.key_lines = {i: child.start_mark.line + 1 for i, child in enumerate(node.value)}
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def load_text(text: str, file: str) -> Any:
    try:
        return yaml.load(text, Loader=_loader(file))
    except _DuplicateKey as e:
        raise DefinitionError([Problem(file, e.line, str(e.key),
                                       f"duplicate key (first set on line {e.first})",
                                       "keep one of the two entries")]) from None
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise DefinitionError([Problem(file, line, "", f"YAML syntax error: {what}",
                                       "check indentation and quoting near this line")]) from None
    except yaml.YAMLError as e:
        raise DefinitionError([Problem(file, None, "", f"YAML error: {e}")]) from None


def load_file(path: Path, display: str | None = None) -> Any:
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DefinitionError([Problem(name, None, "", f"cannot read: {e}")]) from None
    return load_text(text, name)


def line_of(container: Any, key: Any = None) -> int | None:
    if isinstance(container, Located):
        if key is not None and key in container.key_lines:
            return container.key_lines[key]
        return container.line
    return None
