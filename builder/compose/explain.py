"""Human-readable plan, with provenance (`nodeforge plan IMAGE --explain`). Every line is shown
printable (builder.escaping): a value cannot start a new line or reach the terminal as a control
sequence."""

from __future__ import annotations

from typing import Any

from ..escaping import for_terminal
from ..plan import BuildPlan, Value
from .contributions import KINDS


def _v(v: Value, provenance: bool) -> str:
    return f"{v.value}" + (f"    <- {v.source}" if provenance else "")


def _lines(value: Any, provenance: bool) -> list[str]:
    """A merged table as explain shows it: lists in order, maps as key = value (digests shortened)."""
    if isinstance(value, tuple):
        return [_v(v, provenance) for v in value]
    return [f"{k} = {_v(Value(v.value[:12] if k.startswith('/') else v.value, v.source), provenance)}"
            for k, v in value.items()]


def explain(plan: BuildPlan, provenance: bool = False) -> str:
    out = [f"image {plan.image} ({plan.kind}, version {plan.version}) config {plan.config or '-'}",
           f"  key   {plan.key}  (the plan key: a manifest's plan_key, the key `diff` shows)"]
    if plan.base.kind == "debian" and plan.base.debian:
        d = plan.base.debian
        out.append(f"  base  debian {d['suite']} {d['variant']} [{' '.join(d['components'])}] "
                   f"SOURCE_DATE_EPOCH={plan.base.epoch}  {plan.base.key[:12]}")
        out.append(f"        {d['mirror']}" + (f" + {d['security']} {d['suite']}-security" if d.get("security")
                                                else " (no security archive)"))
    else:
        out.append(f"  base  image {plan.base.image}  {plan.base.key[:12]}")
    out.append("  layers:")
    for s in plan.steps:
        out.append(f"    {s.layer:<20} {s.key[:12]}  {'locked' if s.locked else 'unlocked'}  {s.summary}")
        out.extend(f"      reads {h.path} (build host, read-only at {h.mount}; SHA256SUMS {h.sums_sha256[:12]}) "
                   f"for {h.param}" for h in s.host_sources)
    out.append(f"  tags: {', '.join(plan.tags)}")
    sections: list[tuple[str, list[str]]] = [
        ("params", [f"{k} = {_v(v, provenance)}" for k, v in sorted(plan.params.items())])]
    for kind in KINDS:
        if kind.field and kind.explain:
            sections.append((kind.explain, _lines(getattr(plan, kind.field), provenance)))
    sections.append(("tests", [f"[{t.scope}] {t.layer}: {t.name}"
                               + (f" (requires {', '.join(t.requires)})" if t.requires else "") for t in plan.tests]))
    for title, lines in sections:
        if lines:
            out.append(f"  {title}:")
            out.extend(f"    {line}" for line in lines)
    return "\n".join(for_terminal(line) for line in out)  # each a printable line, whatever a value holds
