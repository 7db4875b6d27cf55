"""The search for the highest rate a server sustains: how a step is judged, and how the
rate climbs, then bisects, between steps.

Layer: PURE (decisions over step results; the steps themselves are the caller's
``step``). Shared by ``webhook``; must not run a step or read the clock itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadtest.bench.review_steps import StepResult, ms


@dataclass(frozen=True, slots=True)
class Criteria:
    """What a search step must show to count as sustained."""

    p99_bound_s: float
    min_achieved: float

    def judge(self, result: StepResult) -> StepResult:
        run = result.run
        problems = []
        if run.stopped:
            problems.append("fell behind")
        if run.error_count:
            problems.append(f"{run.error_count} errors")
        p99 = run.latency.percentile(99.0) if run.ok else math.inf
        if p99 > self.p99_bound_s:
            problems.append(f"p99 {ms(p99)} > {ms(self.p99_bound_s)}")
        if run.achieved_rate < self.min_achieved * result.spec.rate:
            problems.append(f"achieved {run.achieved_rate / result.spec.rate:.0%} of offered")
        notes = []
        if problems and result.server_cpu < 0.85:
            notes.append("server CPU < 85 %: not server-bound?")
        if run.ok and run.late.percentile(99) > 0.001:
            notes.append("generator late")
        verdict = "; ".join(problems + notes) if problems else "; ".join(["sustained", *notes])
        return StepResult(
            result.spec,
            result.run,
            result.server_cpu,
            result.generator_cpu,
            result.server_memory,
            passed=not problems,
            verdict=verdict,
        )


@dataclass(frozen=True, slots=True)
class SearchPlan:
    """How a search climbs: first rate, factor per step, bisections, bounds."""

    start: float
    factor: float
    refine: int
    max_steps: int
    duration_s: float
    retry: bool = True
    """Run a failed step once more before believing it: on a shared machine one bad step
    may be a neighbour's burst rather than the server's limit."""


def search(
    plan: SearchPlan,
    criteria: Criteria,
    step: Callable[[float], StepResult],
    out_of_time: Callable[[], bool],
) -> list[StepResult]:
    """Multiply the rate by ``factor`` until a step fails, then bisect ``refine`` times
    between the last rate sustained and the first one not (a failed step is run twice
    with ``retry``; either passing counts). Bounded by ``max_steps`` and ``out_of_time``."""
    results: list[StepResult] = []
    good, bad = 0.0, math.inf
    rate = plan.start
    bisections = 0
    while len(results) < plan.max_steps and not out_of_time():
        result = criteria.judge(step(rate))
        results.append(result)
        if not result.passed and plan.retry and len(results) < plan.max_steps:
            result = criteria.judge(step(rate))
            results.append(result)
        if result.passed:
            good = max(good, rate)
        else:
            bad = min(bad, rate)
        if bad == math.inf:
            rate = round_rate(rate * plan.factor)
            continue
        if good == 0.0:
            rate = round_rate(rate / plan.factor)  # started too high: come down first
            continue
        middle = round_rate((good + bad) / 2)
        if bisections >= plan.refine or middle in (good, bad):
            break
        rate, bisections = middle, bisections + 1
    return results


def round_rate(rate: float) -> float:
    """A rate rounded to a step of 10/s (50/s from 1,000/s): what the tables show."""
    step = 50.0 if rate >= 1000 else 10.0
    return max(step, round(rate / step) * step)


def max_sustained(results: Sequence[StepResult]) -> StepResult | None:
    """The step of the highest rate that passed, if any."""
    passed = [r for r in results if r.passed]
    return max(passed, key=lambda r: r.spec.rate) if passed else None
