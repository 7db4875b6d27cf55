"""What ``bench-webhook --against kueue`` sends and finds: the variants of the captured
Job, each server's slices pooled per phase, the Tessera/Kueue ratios and the report.

Layer: PURE (records and arithmetic over step results; text and a JSON-ready dict out;
``cpu_model`` reads ``/proc``). Must not run a step, and must not change the results it
reports on.
"""

from __future__ import annotations

import argparse
import copy
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from loadtest.bench.review_steps import StepResult
from loadtest.measure.pinned import Settled, cpu_model
from loadtest.measure.stats import Histogram

DISTINCT: Final = 2**62
"""Template numbers of a variant whose bodies all differ: none repeats within a run."""


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    what: str
    renamed: bool
    templates: int
    suspended: bool


VARIANTS: Final = (
    Variant("same", "the captured Job (suspended), the same body every time", False, 1, True),
    Variant(
        "renamed",
        "the captured Job under a new name each time (Tessera answers from what it kept)",
        True,
        1,
        True,
    ),
    Variant(
        "distinct",
        "the captured Job, renamed and annotated with a new number each time (every "
        "answer computed)",
        True,
        DISTINCT,
        True,
    ),
    Variant(
        "unsuspended",
        "the captured Job without spec.suspend, every body distinct as above (Kueue "
        "writes a patch too)",
        True,
        DISTINCT,
        False,
    ),
)


def unsuspended(review_body: dict[str, Any]) -> dict[str, Any]:
    """The captured review of a Job created without ``spec.suspend``."""
    out = copy.deepcopy(review_body)
    out["request"]["object"]["spec"].pop("suspend", None)
    return out


@dataclass(slots=True)
class Pooled:
    """One server's slices of one phase, added up."""

    sent: int = 0
    ok: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)
    """From each request's intended send time (at saturation every request is due at
    once, so there it only says how long the run was: see ``service``)."""
    service: Histogram = field(default_factory=Histogram)
    """From each request's actual send time to its answer."""
    slices: int = 0

    def add(self, step: StepResult) -> None:
        run = step.run
        self.sent += run.sent
        self.ok += run.ok
        self.elapsed_s += run.elapsed_s
        self.cpu_s += step.server_cpu * run.elapsed_s
        self.errors.update(run.errors)
        self.latency.merge(run.latency)
        self.service.merge(run.service)
        self.slices += 1

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cpu_per_review(self) -> float:
        return self.cpu_s / self.sent if self.sent else 0.0

    def p(self, q: float) -> float:
        return self.latency.percentile(q) if self.latency.count else math.inf

    def service_p(self, q: float) -> float:
        return self.service.percentile(q) if self.service.count else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "elapsed_s": self.elapsed_s,
            "achieved_rate": self.rate,
            "server_cpu_s": self.cpu_s,
            "server_cpu_per_review_s": self.cpu_per_review,
            "latency": self.latency.summary().to_json() if self.latency.count else None,
            "service": self.service.summary().to_json() if self.service.count else None,
            "slices": self.slices,
        }


@dataclass(slots=True)
class VariantResult:
    variant: Variant
    patches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each server's JSON Patch for the variant's first review (empty: none)."""
    saturation: dict[str, Pooled] = field(default_factory=dict)
    fixed: dict[float, dict[str, Pooled]] = field(default_factory=dict)

    def ratio(self, value: Callable[[Pooled], float], phase: dict[str, Pooled]) -> float:
        tessera, kueue = value(phase["tessera"]), value(phase["kueue"])
        return tessera / kueue if kueue and math.isfinite(tessera / kueue) else math.inf

    def ratios(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "throughput": self.ratio(lambda p: p.rate, self.saturation),
            "cpu_per_review": self.ratio(lambda p: p.cpu_per_review, self.saturation),
            "p50": {},
            "p99": {},
            "fixed_cpu_per_review": {},
        }
        for rate, phase in self.fixed.items():
            out["p50"][rate] = self.ratio(lambda p: p.p(50), phase)
            out["p99"][rate] = self.ratio(lambda p: p.p(99), phase)
            out["fixed_cpu_per_review"][rate] = self.ratio(lambda p: p.cpu_per_review, phase)
        return out

    def errors(self) -> int:
        phases = [self.saturation, *self.fixed.values()]
        return sum(sum(p.errors.values()) for phase in phases for p in phase.values())

    def target_met(self) -> bool:
        """Tessera at least Kueue's throughput, its p99 no worse at every fixed rate, and
        every answer as expected."""
        ratios = self.ratios()
        return (
            ratios["throughput"] >= 1.0
            and all(r <= 1.0 for r in ratios["p99"].values())
            and self.errors() == 0
        )

    def to_json(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {
            "what": self.variant.what,
            "suspended": self.variant.suspended,
            "patches": self.patches,
            "saturation": {name: p.to_json() for name, p in self.saturation.items()},
            "fixed": [
                {"rate": rate, **{name: p.to_json() for name, p in phase.items()}}
                for rate, phase in self.fixed.items()
            ],
            "ratios": {
                **ratios,
                "p50": [{"rate": r, "ratio": x} for r, x in ratios["p50"].items()],
                "p99": [{"rate": r, "ratio": x} for r, x in ratios["p99"].items()],
                "fixed_cpu_per_review": [
                    {"rate": r, "ratio": x} for r, x in ratios["fixed_cpu_per_review"].items()
                ],
            },
            "target_met": self.target_met(),
        }


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one server takes reviews, and how the generator checks its answers."""

    name: str
    port: int
    pid: int
    ca: Path
    server_name: str
    path: str
    command: str
    cpus: tuple[int, ...]

    def patches(self, variant: Variant) -> bool:
        """Whether its answer to the variant carries a patch."""
        return self.name == "tessera" or not variant.suspended


@dataclass(slots=True)
class Report:
    args: argparse.Namespace
    queues: int
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    variants: list[VariantResult] = field(default_factory=list)
    wall_s: float = 0.0
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    settled: Settled | None = None
    """How long the run waited for Kueue's startup work to end before its first phase."""

    def lines(self) -> Iterator[str]:
        args = self.args
        yield (
            f"Tessera's webhook vs Kueue v0.17.0's: captured Job reviews, "
            f"{self.queues:,} LocalQueues, TLS, {args.connections} keep-alive connections, "
            f"open loop, {args.slice:g} s slices alternating between the servers, "
            f"{args.duration:g} s per server and phase"
        )
        for endpoint in self.endpoints.values():
            cpus = ",".join(map(str, endpoint.cpus))
            yield f"  {endpoint.name:<8} on CPU {cpus}: {endpoint.command}"
        yield f"  load generator on CPU {args.client_core}; CPU: {cpu_model()}"
        yield f"  load average {', '.join(f'{k} {v[0]:.1f}' for k, v in self.load.items())}"
        if self.settled is not None:
            yield (
                f"  first phase after {self.settled.waited_s:.0f} s of waiting for the servers "
                f"and control plane to go quiet ({100 * self.settled.cores:.1f} % of a core "
                f"at the end{'' if self.settled.settled else ': never settled'})"
            )
        for result in self.variants:
            yield ""
            yield from _variant_lines(result)
        yield ""
        yield "== Tessera/Kueue (throughput: higher is better; p99 and CPU: lower is better) =="
        rates = max((len(r.fixed) for r in self.variants), default=0)
        head = f"{'variant':<12} {'throughput':>10} {'CPU/review':>10}"
        head += "".join(f" {f'p99 @{i + 1}':>9}" for i in range(rates))
        yield head + "  target (>= 1.0x throughput, p99 no worse)"
        for result in self.variants:
            ratios = result.ratios()
            line = f"{result.variant.name:<12} {_x(ratios['throughput']):>10} "
            line += f"{_x(ratios['cpu_per_review']):>10}"
            line += "".join(f" {_x(x):>9}" for x in ratios["p99"].values())
            line += "  " + ("met" if result.target_met() else "MISSED")
            yield line
        yield "(@1, @2...: the fixed rates of each variant, as listed above)"
        yield ""
        yield f"wall time {self.wall_s:.0f} s"

    def to_json(self) -> dict[str, Any]:
        return {
            "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
            },
            "local_queues": self.queues,
            "cpu_model": cpu_model(),
            "load_average": self.load,
            "settled": None if self.settled is None else asdict(self.settled),
            "wall_s": self.wall_s,
            "servers": {
                name: {"command": e.command, "cpus": list(e.cpus), "path": e.path}
                for name, e in self.endpoints.items()
            },
            "variants": {r.variant.name: r.to_json() for r in self.variants},
        }


def _x(ratio: float) -> str:
    return f"x{ratio:.2f}" if math.isfinite(ratio) else "-"


def ms(seconds: float) -> str:
    """Milliseconds for a table; ``-`` for none."""
    if not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1000:.2f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


def patch_text(ops: Sequence[dict[str, Any]]) -> str:
    """A JSON Patch in a few words: how many operations, on which paths."""
    if not ops:
        return "no patch"
    paths = ", ".join(sorted({str(op.get("path")) for op in ops})[:4])
    more = "..." if len({op.get("path") for op in ops}) > 4 else ""
    return f"{len(ops)} operations ({paths}{more})"


def _variant_lines(result: VariantResult) -> Iterator[str]:
    variant = result.variant
    yield f"== {variant.name}: {variant.what} =="
    yield "  (latency at saturation: from sending each review; at fixed rates: from when due)"
    for name, ops in result.patches.items():
        yield f"  {name:<8} answers with {patch_text(ops)}"
    yield (
        f"{'phase':<16} {'server':<8} {'achieved/s':>10} {'ok':>8} {'err':>4} {'p50':>9} "
        f"{'p99':>9} {'p99.9':>9} {'CPU/review':>10}"
    )
    phases = [("saturation", result.saturation)]
    phases += [(f"fixed {rate:,.0f}/s", phase) for rate, phase in result.fixed.items()]
    for label, phase in phases:
        for name, pooled in phase.items():
            # at saturation every request is due at once: the time from sending it counts
            p = pooled.service_p if label == "saturation" else pooled.p
            yield (
                f"{label:<16} {name:<8} {pooled.rate:>10,.0f} {pooled.ok:>8,} "
                f"{sum(pooled.errors.values()):>4} {ms(p(50)):>9} {ms(p(99)):>9} "
                f"{ms(p(99.9)):>9} {pooled.cpu_per_review * 1e6:>8.0f}us"
            )
        if label == "saturation":
            yield (
                f"  tessera/kueue: throughput {_x(result.ratio(lambda p: p.rate, phase))}, "
                f"CPU per review {_x(result.ratio(lambda p: p.cpu_per_review, phase))}"
            )
        else:
            yield (
                f"  tessera/kueue: p50 {_x(result.ratio(lambda p: p.p(50), phase))}, "
                f"p99 {_x(result.ratio(lambda p: p.p(99), phase))}, "
                f"CPU per review {_x(result.ratio(lambda p: p.cpu_per_review, phase))}"
            )
    for name, pooled in result.saturation.items():
        for kind, count in sorted(pooled.errors.items()):
            yield f"  {name}: {count} failed at saturation: {kind}"
    for rate, phase in result.fixed.items():
        for name, pooled in phase.items():
            for kind, count in sorted(pooled.errors.items()):
                yield f"  {name}: {count} failed at {rate:,.0f}/s: {kind}"
