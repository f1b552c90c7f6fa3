"""`when:` on the items of list contributions (packages, kernel arguments, modules, blacklist,
services): an item is written plainly, or as `{item: VALUE, when: TEMPLATE}` and then dropped when
the template renders false, 0, no or empty (like a test's `when:`). Files carry `when:` as a key of
their own. A two-kind layer switches a contribution per image kind with
`when: "{{ image.kind == 'node' }}"`, or per parameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import grammar as g
from .spec import Ctx, Field, Spec, Struct

WHEN_DOC = "a template; the item is dropped when it renders false, 0, no or empty"


@dataclass
class Guarded(Spec):
    """A list item: the plain item, or {item: ITEM, when: TEMPLATE}."""

    item: Spec

    def expected(self) -> str:
        return f"{self.item.expected()} (or {{item: ..., when: TEMPLATE}})"

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, dict):
            struct = Struct({"item": Field(self.item, "the item", required=True),
                             "when": Field(g.TEXT, WHEN_DOC, required=True)}, f"{{item, when}} with {self.expected()}")
            return struct.check(value, ctx, parent, key, path)
        return self.item.check(value, ctx, parent, key, path)


def guarded(value: Any) -> bool:
    """Whether a checked list item is the {item, when} form."""
    return isinstance(value, dict) and "item" in value and "when" in value
