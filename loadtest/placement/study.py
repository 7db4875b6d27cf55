"""Placement quality the FGD way: Tessera's scoring against baselines on the openb traces.

Layer: I/O + ROOT (reads the trace CSVs, prints tables, writes JSON; ``main`` is the
CLI). The arithmetic of the method lives in ``fgd``, the cluster and the policies in
``policies``; Tessera's decisions are the extender's own PURE code
(``extender.filters.run_filters``, ``extender.scores.score_node``,
``extender.gpus.choose_gpus``), called on ``NodeState`` values built straight from the
trace rows. Must not change what it measures: no policy knows which trace it runs on.

    python -m loadtest.placement --quick
    python -m loadtest.placement --traces all --seeds 42-51 --json placement.json

The method (``../shared/data/README.md``): 1,213 GPU nodes; per seed the whole trace
shuffled, then draws with replacement until the next would pass 130 % of GPU capacity;
arrival only; a pod fits where CPU, memory, pod count, GPU model and GPUs fit, is
skipped where nothing fits; the best integer score 0-100 wins, ties go to a per-seed
random node order; the allocation % is averaged per rounded arrived %, then the median
over seeds is taken.

Speed: a node's fit and score for a pod shape change only when that node changes, and a
run places one pod at a time, so each shape keeps a row of (score, tie-break) keys per
node and re-scores only the nodes changed since the shape was last seen; the best node
is one ``max`` over that row. Scores of equal node states are memoized.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from loadtest.inputs.asks import PodAsk
from loadtest.inputs.seeds import parse_seeds
from loadtest.inputs.traces import (
    DEFAULT_DATA_DIR,
    OPENB,
    OPENB_POD_VARIANTS,
    TraceNode,
    TracePod,
    read_openb_nodes,
    read_openb_pods,
    trace_file,
)
from loadtest.placement import fgd
from loadtest.placement.policies import NO_FIT, POLICIES, Cluster, Key, Policy, shape_of

REPORT_AT: Final = (100, 110, 120, 130)
PUBLISHED_POLICY: Final = {
    "random": "01-Random",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
DEFAULT_POLICIES: Final = ("tessera", "fgd", "bestfit", "spread", "random")


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class RunResult:
    trace: str
    policy: str
    seed: int
    curve: dict[int, float]
    pods: int
    skipped: int
    skipped_by_kind: dict[str, int]
    skipped_gpu_milli: int
    final_allocation: float
    free_whole_gpus: int
    free_partial_milli: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Played:
    """What one pass over an arrival sequence left behind."""

    points: list[tuple[int, int]]
    """(arrived, allocated) milli-GPUs after every pod."""
    skipped: dict[str, int]
    """Pods that fit nowhere, by kind (``cpu``, ``share``, ``1gpu``, ``8gpu``...)."""
    skipped_gpu_milli: int
    cluster: Cluster


def kind(s: PodAsk) -> str:
    if s.num_gpu == 0:
        return "cpu"
    return "share" if s.gpu_milli < fgd.MILLI else f"{s.num_gpu}gpu"


def play(
    cluster: Cluster,
    sequence: Sequence[PodAsk],
    policy: Policy,
    tie: Sequence[int],
    pick_rng: random.Random,
) -> Played:
    """Place ``sequence`` one pod at a time; ``tie[n]`` is node ``n``'s tie-break
    (higher wins), ``pick_rng`` serves randomized policies."""
    count = len(cluster.names)
    changes: list[int] = []
    rows: dict[PodAsk, tuple[list[Key], list[int]]] = {}
    arrived = allocated = skipped_milli = 0
    skipped: dict[str, int] = {}
    points: list[tuple[int, int]] = []
    for s in sequence:
        arrived += s.gpu_demand
        row = rows.get(s)
        if row is None or len(changes) - row[1][0] >= count:
            stale: Iterable[int] = range(count)
            keys: list[Key] = [NO_FIT] * count
            rows[s] = (keys, [len(changes)])
        else:
            keys = row[0]
            stale = set(changes[row[1][0] :])
            row[1][0] = len(changes)
        for n in stale:
            score = policy.score(cluster, n, s) if cluster.fits(n, s) else None
            keys[n] = NO_FIT if score is None else (score, tie[n])
        if policy.select == "random":
            fitting = [n for n in range(count) if keys[n] is not NO_FIT]
            best = pick_rng.choice(fitting) if fitting else -1
        elif policy.select == "wire":
            best = wire_best(keys)
        else:
            # one node fitting wins outright; else the best score, then the best rank
            top = max(keys)
            best = -1 if top is NO_FIT else keys.index(top)
        if best < 0:
            skipped[kind(s)] = skipped.get(kind(s), 0) + 1
            skipped_milli += s.gpu_demand
        else:
            cluster.take(best, s, policy.choose(cluster, best, s))
            allocated += s.gpu_demand
            changes.append(best)
        points.append((arrived, allocated))
    return Played(points, skipped, skipped_milli, cluster)


def wire_best(keys: Sequence[Key]) -> int:
    """The node kube-scheduler binds given ``decide.wire_scores``' normalized answer:
    ``1 + round(9 (s - low) / (high - low))`` is 10 exactly where s is above
    high - (high - low) / 18 (Python rounds 8.5 to 8); among those, the best rank."""
    scores = [k[0] for k in keys if k is not NO_FIT]
    if not scores:
        return -1
    low, high = min(scores), max(scores)
    floor_ = low - 1.0 if high - low < 1e-9 else high - (high - low) / 18
    return max((k[1], n) for n, k in enumerate(keys) if k is not NO_FIT and k[0] > floor_)[1]


def simulate(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: Policy,
    seed: int,
    trace: str = "",
) -> RunResult:
    """One seed of the method for one policy."""
    started = time.perf_counter()
    capacity = fgd.MILLI * sum(n.gpus for n in nodes)
    shapes = [shape_of(p) for p in pods]
    order = fgd.arrival_sequence([s.gpu_demand for s in shapes], capacity, random.Random(seed))
    ranks = fgd.node_order(len(nodes), random.Random(seed + 1_000_003))
    played = play(
        Cluster.of(nodes),
        [shapes[i] for i in order],
        policy,
        [len(nodes) - r for r in ranks],
        random.Random(seed + 2_000_003),
    )
    gpus = played.cluster.gpus
    return RunResult(
        trace=trace,
        policy=policy.name,
        seed=seed,
        curve=fgd.allocation_curve(played.points, capacity),
        pods=len(order),
        skipped=sum(played.skipped.values()),
        skipped_by_kind=played.skipped,
        skipped_gpu_milli=played.skipped_gpu_milli,
        final_allocation=100.0 * played.points[-1][1] / capacity,
        free_whole_gpus=sum(1 for frees in gpus for f in frees if f == fgd.MILLI),
        free_partial_milli=sum(f for frees in gpus for f in frees if f < fgd.MILLI),
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------- many runs


@dataclass(frozen=True, slots=True)
class Task:
    data_dir: Path
    trace: str
    policy: str
    seeds: tuple[int, ...]


def run_task(task: Task) -> list[RunResult]:
    """Every seed of one (trace, policy): one policy object, so memos carry over."""
    nodes = read_openb_nodes(task.data_dir)
    pods = read_openb_pods(task.data_dir, task.trace)
    policy = POLICIES[task.policy](pods)
    return [simulate(nodes, pods, policy, seed, task.trace) for seed in task.seeds]


def read_published(data_dir: Path) -> dict[tuple[str, str], dict[int, float]]:
    """The FGD artifact's figures: (trace, policy) → {arrived %: allocation %}."""
    path = trace_file(data_dir, OPENB, "fgd_published_allocation.csv")
    out: dict[tuple[str, str], dict[int, float]] = {}
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    for line in lines[1:]:
        cells = line.split(",")
        at = {
            int(col.removeprefix("alloc_at_")): float(v)
            for col, v in zip(header[2:], cells[2:], strict=True)
        }
        out[(cells[0], cells[1])] = at
    return out


def summarize(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    """Per trace and policy: the median over seeds at each reported arrived %."""
    grouped: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        grouped.setdefault((r.trace, r.policy), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for (trace, policy), runs in grouped.items():
        at = {
            x: fgd.median([r.curve[x] for r in runs if x in r.curve])
            for x in REPORT_AT
            if any(x in r.curve for r in runs)
        }
        out.setdefault(trace, {})[policy] = {
            "median_at": at,
            "seeds": [r.seed for r in runs],
            "skipped_median": fgd.median([r.skipped for r in runs]),
            "skipped_gpu_milli_median": fgd.median([r.skipped_gpu_milli for r in runs]),
            "free_whole_gpus_median": fgd.median([r.free_whole_gpus for r in runs]),
            "free_partial_milli_median": fgd.median([r.free_partial_milli for r in runs]),
            "seconds_total": sum(r.seconds for r in runs),
        }
    return out


def table(
    trace: str, summary: dict[str, Any], published: dict[tuple[str, str], dict[int, float]]
) -> list[str]:
    cols = "".join(f"{x:>9}%" for x in REPORT_AT)
    lines = [f"== {trace}", f"{'policy':<24}{cols}   skipped  free-GPU  frag-milli   secs"]
    for policy, s in summary.items():
        at = s["median_at"]
        cells = "".join(f"{at[x]:>10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT)
        lines.append(
            f"{policy:<24}{cells}{s['skipped_median']:>10.0f}{s['free_whole_gpus_median']:>10.0f}"
            f"{s['free_partial_milli_median']:>12.0f}{s['seconds_total']:>7.0f}"
        )
    for ours, theirs in PUBLISHED_POLICY.items():
        pub = published.get((trace, theirs))
        if pub is None:
            continue
        cells = "".join(f"{pub[x]:>10.2f}" for x in REPORT_AT)
        lines.append(f"{'published ' + theirs:<24}{cells}")
        if ours in summary and ours != "random":
            at = summary[ours]["median_at"]
            delta = "".join(
                f"{at[x] - pub[x]:>+10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT
            )
            lines.append(f"{'  ' + ours + ' - published':<24}{delta}")
    fgd_pub = published.get((trace, "06-FGD"))
    if fgd_pub is not None:
        for policy, s in summary.items():
            if policy.startswith("tessera"):
                at = s["median_at"]
                delta = "".join(
                    f"{at[x] - fgd_pub[x]:>+10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT
                )
                lines.append(f"{'  ' + policy + ' - FGD pub':<24}{delta}")
    return lines


def _str_keys(values: dict[int, float]) -> dict[str, float]:
    """JSON objects have string keys: arrived % as text."""
    return {str(k): v for k, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    args, traces, seeds, policies = _parse(argv)
    published = read_published(args.data)
    # one task per (trace, policy, seed): even load on both processes
    tasks = [Task(args.data, t, p, (seed,)) for t in traces for p in policies for seed in seeds]
    started = time.perf_counter()
    results = _run_all(tasks, args.processes)
    elapsed = time.perf_counter() - started
    summary = summarize(results)
    for trace in traces:
        ordered = {p: summary[trace][p] for p in policies if p in summary.get(trace, {})}
        print("\n".join(table(trace, ordered, published)))
        print()
    print(f"{len(tasks)} runs in {elapsed:.0f} s on {args.processes} processes")
    if args.json is not None:
        args.json.write_bytes(jsonio.dumps(_json(seeds, elapsed, summary, published, results)))
    return 0


def _parse(
    argv: list[str] | None,
) -> tuple[argparse.Namespace, list[str], tuple[int, ...], list[str]]:
    """The flags, and the traces, seeds and policies they name."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.placement",
        description="Placement quality on the Alibaba openb traces, the FGD artifact's way.",
        epilog=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("TESSERA_DATA", DEFAULT_DATA_DIR)),
        help="folder with the shared traces (default: $TESSERA_DATA or ../shared/data)",
    )
    parser.add_argument("--traces", default="all", help="all, or names like default,cpu050")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 (the artifact's)")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, of: {', '.join(POLICIES)}",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="one seed (42), default trace")
    args = parser.parse_args(argv)

    traces = list(OPENB_POD_VARIANTS) if args.traces == "all" else args.traces.split(",")
    seeds = parse_seeds(args.seeds)
    if args.quick:
        traces, seeds = ["default"], (42,)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in [*policies] if p not in POLICIES] + [
        t for t in traces if t not in OPENB_POD_VARIANTS
    ]
    if unknown:
        parser.error(f"unknown policy or trace: {', '.join(unknown)}")
    return args, traces, seeds, policies


def _run_all(tasks: Sequence[Task], processes: int) -> list[RunResult]:
    """The tasks on ``processes`` forked workers, progress on stderr."""
    results: list[RunResult] = []
    with get_context("fork").Pool(max(1, processes)) as pool:
        for done, batch in enumerate(pool.imap_unordered(run_task, tasks), start=1):
            results.extend(batch)
            r = batch[0]
            print(
                f"[{done}/{len(tasks)}] {r.trace} {r.policy} seed {r.seed}: "
                f"{r.curve.get(130, float('nan')):.2f} % at 130 %, {r.seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return results


def _json(
    seeds: Sequence[int],
    elapsed: float,
    summary: dict[str, dict[str, Any]],
    published: dict[tuple[str, str], dict[int, float]],
    results: Sequence[RunResult],
) -> dict[str, Any]:
    """``--json``'s document: the method, the summary, the published figures, every run."""
    return {
        "method": "FGD artifact (../shared/data/README.md)",
        "seeds": list(seeds),
        "elapsed_s": elapsed,
        "summary": {
            t: {p: {**v, "median_at": _str_keys(v["median_at"])} for p, v in per.items()}
            for t, per in summary.items()
        },
        "published": {f"{t}/{p}": _str_keys(v) for (t, p), v in published.items()},
        "runs": [
            {
                "trace": r.trace,
                "policy": r.policy,
                "seed": r.seed,
                "curve": _str_keys(r.curve),
                "pods": r.pods,
                "skipped": r.skipped,
                "skipped_by_kind": r.skipped_by_kind,
                "skipped_gpu_milli": r.skipped_gpu_milli,
                "final_allocation": r.final_allocation,
                "free_whole_gpus": r.free_whole_gpus,
                "free_partial_milli": r.free_partial_milli,
                "seconds": r.seconds,
            }
            for r in results
        ],
    }
