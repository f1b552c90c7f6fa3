"""YAML with positions: every mapping and list remembers the line of each of its keys and items.

Definitions are untrusted input, so reading one is bounded: the file's size, the nesting depth,
the size of the document once its aliases are expanded (an alias bomb is refused before anything is
constructed), the length of a number; duplicate keys (PyYAML silently keeps the last one), complex
mapping keys and recursive aliases are errors. Every refusal names the file and the line."""

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


MAX_FILE_BYTES = 1024 * 1024
MAX_DEPTH = 64  # nested mappings and lists
MAX_NODES = 200_000  # scalars, mappings and lists of the document with every alias expanded
MAX_NUMBER_CHARS = 32  # a YAML integer or float as written


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first


class _Refused(Exception):
    """A bound or a shape the loader does not take: (line, key, message, remedy)."""

    def __init__(self, line: int | None, key: str, message: str, remedy: str) -> None:
        self.line, self.key, self.message, self.remedy = line, key, message, remedy


def _check_depth(text: str, loader_cls: type[yaml.SafeLoader]) -> None:
    """Nesting depth from the parser's events (the composer that follows is recursive)."""
    depth = 0
    for event in yaml.parse(text, Loader=loader_cls):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise _Refused(line, "", f"nested deeper than {MAX_DEPTH} levels", "flatten the structure")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_graph(root: yaml.Node) -> None:
    """The expanded size of the node graph, counted without expanding it (shared nodes once each),
    and no node that contains itself."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in on_path:
            raise _Refused(node.start_mark.line + 1, "", "an alias refers to a node that contains it",
                           "remove the recursive alias")
        on_path.add(id(node))
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(size(k) + size(v) for k, v in node.value)
        on_path.discard(id(node))
        sizes[id(node)] = n
        if n > MAX_NODES:
            raise _Refused(node.start_mark.line + 1, "",
                           f"with its aliases expanded the document has more than {MAX_NODES} values "
                           "(an alias bomb?)", "write the values out, without nested aliases")
        return n

    size(root)


# libyaml's parser where PyYAML was built with it (Debian's is): the same events and marks, several
# times faster than the pure-Python one on a whole tree of definitions
_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _loader(file: str) -> type[yaml.SafeLoader]:
    class Loader(_BASE):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LDict:
        loader.flatten_mapping(node)
        out = LDict()
        out.file, out.line, out.key_lines = file, node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(line, "", "a mapping key must be a plain name or number, found a "
                               + ("list" if isinstance(key_node, yaml.SequenceNode) else "mapping"),
                               "write the key as a plain string")
            key = loader.construct_object(key_node, deep=True)
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

    def construct_number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        if len(str(node.value)) > MAX_NUMBER_CHARS:
            raise _Refused(node.start_mark.line + 1, "",
                           f"a number longer than {MAX_NUMBER_CHARS} characters", "use a smaller number")
        if node.tag.endswith(":int"):
            return yaml.SafeLoader.construct_yaml_int(loader, node)
        return yaml.SafeLoader.construct_yaml_float(loader, node)

    Loader.add_constructor("tag:yaml.org,2002:int", construct_number)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_number)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def _load(text: str, loader_cls: type[yaml.SafeLoader]) -> Any:
    _check_depth(text, loader_cls)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_text(text: str, file: str) -> Any:
    try:
        return _load(text, _loader(file))
    except _Refused as e:
        raise DefinitionError([Problem(file, e.line, e.key, e.message, e.remedy)]) from None
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
    except (ValueError, TypeError, RecursionError) as e:  # a value PyYAML cannot construct (2024-02-30)
        raise DefinitionError([Problem(file, None, "", f"YAML value error: {e}",
                                       "quote the value to keep it a string")]) from None


def load_file(path: Path, display: str | None = None) -> Any:
    name = display or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DefinitionError([Problem(name, None, "", f"the file has {size} bytes, more than the "
                                           f"{MAX_FILE_BYTES} a definition may have", "split it or shorten it")])
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
