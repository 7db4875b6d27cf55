"""The reservation study's figures: per run, then per policy as medians over seeds, and
the table that shows them.

Layer: PURE (numbers in, numbers and lines out; no I/O, no clock). Must not run
anything. Percentiles are nearest-rank (``loadtest.measure.stats``): a p99 is a wait
some gang really had. A run's waits include those of measured jobs still waiting at
its hard stop, counted up to it (``unstarted`` says how many): for them the figure is a
lower bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from loadtest.measure.stats import percentile
from loadtest.reservations.engine import RunResult, Wait
from loadtest.reservations.workload import GANG_GPUS, GANG_SIZES

BIG_GANG_GPUS: Final = 16
"""Gangs of this many GPUs or more: the issue's ``gang16``."""

Figures = dict[str, Any]


def run_figures(result: RunResult) -> Figures:
    """What one run shows: waits of big gangs (and by size), of all jobs and of single
    pods, GPU allocation and the GPUs held idle for reservations."""
    waits = result.waits
    big = [w.wait_s for w in waits if w.members > 1 and w.gpus >= BIG_GANG_GPUS]
    singles = [w.wait_s for w in waits if w.members == 1]
    return {
        "gangs": len(big),
        "gang16_p50_wait_s": _pct(big, 50),
        "gang16_p99_wait_s": _pct(big, 99),
        "gang16_mean_wait_s": _mean(big),
        "gangs_by_gpus": _by_size(waits),
        "jobs": len(waits),
        "mean_wait_s": _mean([w.wait_s for w in waits]),
        "single_mean_wait_s": _mean(singles),
        "single_p99_wait_s": _pct(singles, 99),
        "mean_allocation_pct": result.mean_allocation_pct,
        "idle_held_gpu_hours": result.idle_held_gpu_hours,
        "warm_allocation_pct": result.warm_allocation_pct,
        "unstarted": result.unstarted,
        "impossible": result.impossible,
        "ended_at_h": result.ended_at_s / 3600.0,
        "events": result.events,
    }


def _by_size(waits: Iterable[Wait]) -> dict[str, Figures]:
    sizes: dict[int, list[float]] = {}
    for wait in waits:
        if wait.members > 1:
            sizes.setdefault(wait.gpus, []).append(wait.wait_s)
    return {
        str(gpus): {
            "gangs": len(found),
            "p50_wait_s": _pct(found, 50),
            "p99_wait_s": _pct(found, 99),
        }
        for gpus, found in sorted(sizes.items())
    }


def _pct(values: Sequence[float], q: float) -> float | None:
    return percentile(sorted(values), q) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def policy_summary(runs: Sequence[Figures]) -> Figures:
    """Medians over the seeds' ``run_figures`` (a figure no run had is None), and the
    runs themselves."""
    scalars = [k for k, v in runs[0].items() if not isinstance(v, dict)]
    summary: Figures = {key: _median(r[key] for r in runs) for key in scalars}
    sizes = sorted({size for r in runs for size in r["gangs_by_gpus"]}, key=int)
    summary["gangs_by_gpus"] = {
        size: {
            key: _median(r["gangs_by_gpus"][size][key] for r in runs if size in r["gangs_by_gpus"])
            for key in ("gangs", "p50_wait_s", "p99_wait_s")
        }
        for size in sizes
    }
    summary["unstarted_total"] = sum(r["unstarted"] for r in runs)
    summary["per_seed"] = list(runs)
    return summary


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def document(per_policy: Mapping[str, Sequence[Figures]], config: Figures) -> Figures:
    """``--json``'s document: ``{"policies": {name: summary}}``, each summary with the
    run's settings under ``config``."""
    return {
        "policies": {
            name: {**policy_summary(runs), "config": dict(config)}
            for name, runs in per_policy.items()
        }
    }


# ---------------------------------------------------------------- the table


def table(policies: Mapping[str, Figures]) -> list[str]:
    """The summary as a person reads it: hours for gangs, seconds for all jobs."""
    lines = [
        f"{'policy':<9}{'gangs':>6}{'gang16 p50':>12}{'gang16 p99':>12}{'mean wait':>11}"
        f"{'pod p99':>9}{'alloc %':>9}{'idle held':>11}{'unstarted':>11}",
    ]
    for name, s in policies.items():
        lines.append(
            f"{name:<9}{_num(s['gangs'], 0):>6}{_hours(s['gang16_p50_wait_s']):>12}"
            f"{_hours(s['gang16_p99_wait_s']):>12}{_secs(s['mean_wait_s']):>11}"
            f"{_secs(s['single_p99_wait_s']):>9}{_num(s['mean_allocation_pct'], 2):>9}"
            f"{_num(s['idle_held_gpu_hours'], 0) + ' GPU-h':>11}{s['unstarted_total']:>11}"
        )
    sizes = [str(GANG_GPUS * m) for m in GANG_SIZES]
    lines += ["", "gang wait by size (GPUs), p50 / p99:"]
    lines.append(f"{'policy':<9}" + "".join(f"{size:>16}" for size in sizes))
    for name, s in policies.items():
        by = s["gangs_by_gpus"]
        cells = (
            f"{_hours(by[size]['p50_wait_s'])}/{_hours(by[size]['p99_wait_s'])}"
            if size in by
            else "-"
            for size in sizes
        )
        lines.append(f"{name:<9}" + "".join(f"{cell:>16}" for cell in cells))
    return lines


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f}h"


def _secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
