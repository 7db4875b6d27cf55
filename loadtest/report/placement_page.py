"""The placement study's page: GPU allocation against arrived load, per policy and
trace (the FGD paper's figure), from ``python -m loadtest placement --json``'s file.

Layer: PURE. The study's JSON in, HTML text out; no I/O, no clock. Must not change the
figures it draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from cluster.svg import Series, line_chart


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def placement_curves(data: Mapping[str, Any]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """trace → policy → (arrived %, median allocation % over seeds), from the ``runs`` of
    ``python -m loadtest placement --json``; published figures as ``<policy> (published)``."""
    curves: dict[str, dict[str, dict[int, list[float]]]] = {}
    for run in data.get("runs", []):
        per_x = curves.setdefault(run["trace"], {}).setdefault(run["policy"], {})
        for x, y in run["curve"].items():
            per_x.setdefault(int(x), []).append(float(y))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for trace, policies in curves.items():
        out[trace] = {
            policy: [(float(x), _median(ys)) for x, ys in sorted(per_x.items())]
            for policy, per_x in policies.items()
        }
    for key, points in data.get("published", {}).items():
        trace, _, policy = key.partition("/")
        if trace in out:
            out[trace][f"{policy} (published)"] = sorted(
                (float(x), float(y)) for x, y in points.items()
            )
    return out


def placement_page(data: Mapping[str, Any], title: str) -> str:
    """One chart per trace: GPU allocation vs arrived load, per policy (the FGD figure)."""
    charts = []
    for trace, policies in sorted(placement_curves(data).items()):
        ours = [Series(p, pts) for p, pts in policies.items() if not p.endswith("(published)")]
        published = [
            Series(p, pts, dashed=True)
            for p, pts in policies.items()
            if p.endswith("(published)") and any(k in p.lower() for k in ("fgd", "bestfit"))
        ]
        # The whole curve, then the part where policies differ (from 90 % arrived).
        for label, low in (("", 0.0), (" (from 90 % arrived)", 90.0)):
            charts.append(
                line_chart(
                    f"openb {trace}: GPU allocation vs arrived load{label}",
                    [
                        Series(s.label, [p for p in s.points if p[0] >= low], s.dashed)
                        for s in (*ours, *published)
                    ],
                    x_label="arrived GPU demand (% of capacity)",
                    y_label="GPUs allocated (% of capacity)",
                    x_unit="%",
                    y_unit="%",
                    y_min=None if low else 0.0,
                )
            )
    body = "".join(charts) or "<p>no runs in the file</p>"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
        "</title><style>body { font-family: sans-serif; margin: 24px; }"
        " .grid { display: flex; flex-wrap: wrap; gap: 16px; }"
        " .grid svg { border: 1px solid #ddd; }</style></head><body>"
        f'<h1>{escape(title)}</h1><div class="grid">{body}</div></body></html>\n'
    )
