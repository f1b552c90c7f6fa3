"""Jinja2 rendering with StrictUndefined: every string contribution of a layer is a template."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2

from ..errors import Collector

# a list item that is exactly "{{ expr }}" and evaluates to a list is spliced into the list
_WHOLE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")


def environment(files_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(files_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _explain(e: Exception) -> str:
    if isinstance(e, jinja2.UndefinedError):
        return f"template uses an undefined name: {e.message}"
    if isinstance(e, jinja2.TemplateSyntaxError):
        return f"template syntax error: {e.message}"
    return f"template failed: {e}"


def render_string(env: jinja2.Environment, text: str, context: dict[str, Any], out: Collector,
                  file: str, line: int | None, path: str) -> str | None:
    if "{{" not in text and "{%" not in text:
        return text
    try:
        return env.from_string(text).render(context)
    except Exception as e:  # jinja raises many kinds; all are a user's template problem
        out.add(file, line, path, _explain(e), "parameters in scope: " + ", ".join(sorted(context)))
        return None


def render_file(env: jinja2.Environment, name: str, context: dict[str, Any], out: Collector,
                file: str, line: int | None, path: str) -> str | None:
    try:
        return env.get_template(name).render(context)
    except Exception as e:
        where = getattr(e, "lineno", None)
        extra = f" (files/{name} line {where})" if where else f" (files/{name})"
        out.add(file, line, path, _explain(e) + extra, "parameters in scope: " + ", ".join(sorted(context)))
        return None


def render_tree(env: jinja2.Environment, value: Any, context: dict[str, Any], out: Collector, file: str,
                line: int | None, path: str) -> Any:
    """Render every string in a nested structure; list items that render empty are dropped."""
    if isinstance(value, str):
        return render_string(env, value, context, out, file, line, path)
    if isinstance(value, list):
        items: list[Any] = []
        for i, v in enumerate(value):
            m = _WHOLE.fullmatch(v) if isinstance(v, str) else None
            if m:
                try:
                    spliced = env.compile_expression(m.group(1), undefined_to_none=False)(**context)
                except Exception as e:
                    out.add(file, line, f"{path}[{i}]", _explain(e),
                            "parameters in scope: " + ", ".join(sorted(context)))
                    continue
                if isinstance(spliced, list | tuple):
                    items.extend(str(x) for x in spliced)
                    continue
            r = render_tree(env, v, context, out, file, line, f"{path}[{i}]")
            if r is None or (isinstance(r, str) and r.strip() == ""):
                continue
            items.append(r.strip() if isinstance(r, str) else r)
        return items
    if isinstance(value, dict):
        return {k: render_tree(env, v, context, out, file, line, f"{path}.{k}") for k, v in value.items()}
    return value
