"""Human-readable plan, with provenance (`nodeforge plan IMAGE --explain`)."""

from __future__ import annotations

from ..plan import BuildPlan, Value


def _v(v: Value, provenance: bool) -> str:
    return f"{v.value}" + (f"    <- {v.source}" if provenance else "")


def explain(plan: BuildPlan, provenance: bool = False) -> str:
    out = [f"image {plan.image} ({plan.kind}, version {plan.version}) config {plan.config or '-'}",
           f"  key   {plan.key}"]
    if plan.base.kind == "debian" and plan.base.debian:
        d = plan.base.debian
        out.append(f"  base  debian {d['suite']} {d['variant']} [{' '.join(d['components'])}] "
                   f"SOURCE_DATE_EPOCH={plan.base.epoch}  {plan.base.key[:12]}")
    else:
        out.append(f"  base  image {plan.base.image}  {plan.base.key[:12]}")
    out.append("  layers:")
    for s in plan.steps:
        out.append(f"    {s.layer:<20} {s.key[:12]}  {'locked' if s.locked else 'unlocked'}  {s.summary}")
    out.append(f"  tags: {', '.join(plan.tags)}")
    sections: list[tuple[str, list[str]]] = [
        ("params", [f"{k} = {_v(v, provenance)}" for k, v in sorted(plan.params.items())]),
        ("kernel command line", [_v(v, provenance) for v in plan.kernel_args]),
        ("sysctl", [f"{k} = {_v(v, provenance)}" for k, v in plan.sysctl.items()]),
        ("modules loaded", [_v(v, provenance) for v in plan.modules]),
        ("module options", [f"{k} = {_v(v, provenance)}" for k, v in plan.modprobe.items()]),
        ("modules blacklisted", [_v(v, provenance) for v in plan.blacklist]),
        ("services enabled", [_v(v, provenance) for v in plan.services_enabled]),
        ("services disabled", [_v(v, provenance) for v in plan.services_disabled]),
        ("env", [f"{k} = {_v(v, provenance)}" for k, v in plan.env.items()]),
        ("packages", [f"{k} {_v(v, provenance)}" for k, v in sorted(plan.packages.items())]),
        ("files", [f"{k} {_v(Value(v.value[:12], v.source), provenance)}" for k, v in sorted(plan.files.items())]),
        ("tests", [f"[{t.scope}] {t.layer}: {t.name}" + (f" (requires {', '.join(t.requires)})" if t.requires else "")
                   for t in plan.tests]),
    ]
    for title, lines in sections:
        if lines:
            out.append(f"  {title}:")
            out.extend(f"    {line}" for line in lines)
    return "\n".join(out)
