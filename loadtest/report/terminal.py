"""A simulated run's summary for the terminal: admission, Kueue's queues, placement (with
examples of where gangs and shares went), latency per verb, utilisation, memory and the
run's checks.

Layer: PURE. A ``SimResult`` and its JSON in, text lines out; no I/O, no clock. Must not
change the result it reports on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadtest.measure.stats import Summary
from loadtest.report.summary import latency_summaries, summarize
from loadtest.sim.records import SimResult


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def latency_lines(summaries: Mapping[str, Summary], errors: Mapping[str, int]) -> list[str]:
    head = f"  {'verb':<22}{'count':>7}" + "".join(
        f" {h:>8}" for h in ("p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms")
    )
    head += f" {'errors':>6}"
    lines = [head]
    for verb, s in summaries.items():
        errs = sum(
            n
            for k, n in errors.items()
            if k.split(":", 1)[0] in (verb, "filter/prioritize") and verb in k.split(":", 1)[0]
        )
        lines.append(
            f"  {verb:<22}{s.count:>7} {_ms(s.p50)} {_ms(s.p90)} {_ms(s.p99)} "
            f"{_ms(s.p999)} {_ms(s.maximum)} {errs:>6}"
        )
    return lines


def placement_examples(result: SimResult, per_kind: int = 2) -> list[str]:
    """A few bound jobs of each interesting kind: gangs (with their racks), shares,
    multi-GPU and single-GPU jobs, with the GPU indices the extender chose."""
    out: list[str] = []
    for kind in ("gang", "share", "multi-gpu", "1-gpu"):
        shown = 0
        for job in result.jobs.values():
            placed = [result.pods[k] for k in job.pods if result.pods[k].bound_s is not None]
            if job.spec.kind != kind or not placed or len(placed) < len(job.pods):
                continue
            where = ", ".join(f"{p.node}[{p.indices}]" for p in placed)
            racks = sorted({p.rack for p in placed if p.rack})
            topology = f" in {', '.join(racks)}" if kind == "gang" and racks else ""
            out.append(f"{job.spec.name} ({kind}, {job.flavor}){topology}: {where}")
            shown += 1
            if shown >= per_kind:
                break
    return out


def summary_lines(result: SimResult, data: Mapping[str, Any], placements: int = 6) -> list[str]:
    lines = _admission_lines(result, data)
    lines += ["", *_kueue_lines(result, data)]
    lines += ["", *_placement_lines(result, data, placements)]
    lines += ["", *_throughput_lines(result, data)]
    if result.open_loop:
        lines += ["", *_open_loop_lines(result)]
    lines += _health_lines(result, data)
    return lines


def _admission_lines(result: SimResult, data: Mapping[str, Any]) -> list[str]:
    jobs = data["jobs"]
    lines = [
        f"cluster: {result.nodes} nodes, {result.gpus_total} GPUs; "
        f"run {result.duration_s:.1f} s (jobs arriving for {result.arrivals_s:.1f} s)",
        "",
        f"admission (webhook over TLS): {jobs['created']} jobs reviewed, "
        f"{jobs['created'] - jobs['denied']} allowed, {jobs['denied']} denied",
    ]
    for d in result.denials[:8]:
        lines.append(f"  denied {d.job} ({d.kind}, {d.code}): {d.message}")
    refused = sum(n for k, n in result.errors.items() if k.startswith("update:"))
    lines.append(
        f"  unsuspends (Kueue's UPDATE, reviewed too): {len(result.latencies['update'])} "
        f"answered, {refused} refused or failed"
    )
    return lines


def _kueue_lines(result: SimResult, data: Mapping[str, Any]) -> list[str]:
    jobs = data["jobs"]
    lines = [
        f"Kueue: {jobs['admitted']} admitted "
        f"({jobs['admitted_borrowing']} borrowing from the cohort), "
        f"{jobs['waiting_at_end']} still waiting, {jobs['finished']} finished",
        f"  {'LocalQueue':<34}{'jobs':>6} {'wait p50':>9} {'p90':>8} {'max':>8}",
    ]
    for queue, waits in sorted(result.queue_waits().items()):
        s = summarize(waits)
        lines.append(f"  {queue:<34}{s.count:>6} {s.p50:>8.2f}s {s.p90:>7.2f}s {s.maximum:>7.2f}s")
    return lines


def _placement_lines(result: SimResult, data: Mapping[str, Any], placements: int) -> list[str]:
    pods = data["pods"]
    lines = [
        f"placement (kube-scheduler + extender): {pods['bound']} of {pods['created']} pods bound, "
        f"{pods['pending_at_end']} pending at the end",
    ]
    lines += [f"  {line}" for line in placement_examples(result, per_kind=placements // 3)]
    start = data["pod_start_s"]
    lines.append(
        f"  pod start (Kueue admission to bound, retries included): p50 {start['p50_s']:.3f} s, "
        f"p99 {start['p99_s']:.3f} s, max {start['max_s']:.3f} s"
    )
    if result.filter_reasons:
        lines.append("  why pods waited (retried later):")
        for reason, n in result.filter_reasons.most_common(4):
            lines.append(f"    {n:>5} x {reason}")
    return lines


def _throughput_lines(result: SimResult, data: Mapping[str, Any]) -> list[str]:
    util = data["gpu_utilisation"]
    return [
        "latency in the cluster run (reviews timed from their intended send time; extender "
        "verbs as one kube-scheduler loop sends them):",
        *latency_lines(latency_summaries(result.latencies), result.errors),
        f"  throughput: {data['throughput_per_s']['reviews']:.1f} reviews/s, "
        f"{data['throughput_per_s']['binds']:.1f} binds/s "
        f"(peak {data['throughput_per_s']['peak_binds']:.1f}/s)",
        "",
        f"GPU utilisation: {util['mean_pct_second_half']:.1f} % mean "
        "in the second half of arrivals, "
        f"peak {util['peak_pct']:.1f} % ({util['peak_gpus']:.1f} of {result.gpus_total} GPUs)",
    ]


def _open_loop_lines(result: SimResult) -> list[str]:
    names = max((int(run.get("names", 0)) for run in result.open_loop.values()), default=0)
    lines = [
        "each verb alone, open loop (latency from the intended send time; "
        f"{names:,} candidate nodes per extender call, as kube-scheduler sends them):",
        f"  {'verb':<12}{'rate/s':>8}{'achieved':>9}{'ok':>7}{'errors':>7}"
        + "".join(f" {h:>8}" for h in ("p50 ms", "p90 ms", "p99 ms", "p99.9 ms")),
    ]
    for verb, run in result.open_loop.items():
        lat = run["latency_s"]
        errs = sum(run["errors"].values())
        lines.append(
            f"  {verb:<12}{run['rate']:>8.0f}{run['achieved_rate']:>9.1f}{run['ok']:>7}"
            f"{errs:>7} {_ms(lat['p50_s'])} {_ms(lat['p90_s'])} {_ms(lat['p99_s'])} "
            f"{_ms(lat['p99.9_s'])}"
        )
    return lines


def _health_lines(result: SimResult, data: Mapping[str, Any]) -> list[str]:
    """Memory, the run's checks, bind refusals and errors."""
    lines = [
        f"RSS {name}: {r['first_mib']:.0f} MiB at start, peak {r['peak_mib']:.0f} MiB, "
        f"{r['last_mib']:.0f} MiB at the end"
        for name, r in data["rss"].items()
    ]
    c = data["checks"]
    if not result.gpus_checked:
        lines.append("GPU indices not checked: a remote extender records them in its own cluster")
    lines.append(
        "checks: "
        + ("all passed" if c["ok"] else "FAILED")
        + f" (GPU over-allocations {c['over_allocations']}, "
        f"unhealthy GPUs used {c['unhealthy_used']}, "
        f"pods lost {c['pods_lost']}, unexpected denials {c['unexpected_denials']})"
    )
    if result.bind_refusals:
        refused = sum(result.bind_refusals.values())
        lines.append(
            f"bind refusals (re-checked at bind, pod retried): {refused}, e.g. "
            + result.bind_refusals.most_common(1)[0][0]
        )
    if result.errors:
        lines.append("errors: " + ", ".join(f"{k} x{n}" for k, n in result.errors.most_common(5)))
    return lines
