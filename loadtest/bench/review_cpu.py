"""CPU per review of the webhook's pure path, in process: a before/after micro-benchmark.

Layer: ROOT (a script: reads argv, reads the captures, may start itself in another
source tree, prints). Must not be imported by the servers or run by pytest.

``python -m loadtest.bench.review_cpu [--variant distinct] [--reviews 2000] [--runs 7]``
calls ``webhook.review_flow.review`` as the server does (no HTTP, no TLS) on the captured
Job's review under the policy ``bench-webhook`` generates (``--queues 1000``, ``--seed
1``), with bodies as ``bench-webhook --against kueue`` sends them: ``same`` (one body),
``renamed`` (a new name each: kept answers), ``distinct`` (a new annotation each: every
answer computed) or ``unsuspended`` (distinct, without ``spec.suspend``). It prints the
median, over ``--runs``, of the process CPU time per review, in microseconds, with the
garbage collector managed as the server manages it (``server.heap``).
``--profile N`` prints instead cProfile's top ``N`` functions of one run by own time.

``--against DIR`` compares with another checkout of the repository (``git archive main |
tar -x -C /tmp/base``): a worker process in each tree, both pinned to one core, takes
turns reviewing the same bodies in batches of ``--batch``, so that a neighbour's burst on
a shared machine slows both alike; the ratio this/that per run, and its median, is what
to quote, never an absolute figure from another time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from loadtest.bench.against_kueue_results import DISTINCT, unsuspended
from loadtest.bench.review_steps import ReviewTemplate, uid_prefix
from loadtest.bench.webhook_policy import DEFAULT_CAPTURES, load_captured_review, policy_objects
from server import heap
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig

VARIANTS: Final = ("same", "renamed", "distinct", "unsuspended")


def bodies(variant: str, count: int, captures: Path, first: int = 0) -> list[bytes]:
    """``count`` review bodies of ``variant`` (see the module's docstring), numbered from
    ``first``: bodies of different numbers differ (but in ``same``)."""
    captured = load_captured_review(captures)
    if variant == "unsuspended":
        captured = unsuspended(captured)
    renamed = variant != "same"
    templates = DISTINCT if variant in ("distinct", "unsuspended") else 1
    template = ReviewTemplate.of(captured, templates, renamed=renamed)
    prefix = uid_prefix()
    return [template.body(f"{prefix}{i:012x}", i) for i in range(first, first + count)]


def measure(args: argparse.Namespace) -> list[float]:
    """CPU seconds per review of each run, with the collector managed as the server
    manages it (``server.heap``)."""
    policy = policy_from_objects(policy_objects(args.queues, args.seed))
    config = AdmitConfig()
    with heap.short_pauses():
        return _runs(args, policy, config)


def _runs(args: argparse.Namespace, policy: Policy, config: AdmitConfig) -> list[float]:
    runs: list[float] = []
    for run in range(args.runs):
        # each run its own bodies: a distinct body is computed, never found kept
        sent = bodies(args.variant, args.reviews, args.captures, run * args.reviews)
        for body in sent[:1]:
            _check(review(body, policy, config).status)
        gc.collect()
        start = time.process_time()
        for body in sent:
            review(body, policy, config)
        runs.append((time.process_time() - start) / len(sent))
    return runs


def _check(status: int) -> None:
    if status != 200:
        raise SystemExit(f"the captured review was answered with HTTP {status}")


def profile(args: argparse.Namespace) -> None:
    policy = policy_from_objects(policy_objects(args.queues, args.seed))
    config = AdmitConfig()
    sent = bodies(args.variant, args.reviews, args.captures)
    _check(review(sent[0], policy, config).status)
    profiler = cProfile.Profile()
    with heap.short_pauses():
        profiler.enable()
        for body in sent[1:]:
            review(body, policy, config)
        profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(args.profile)
    stats.sort_stats("cumulative").print_stats(args.profile)


def serve_batches(args: argparse.Namespace) -> None:
    """``--worker``: read ``<count> <first>`` lines, review that many bodies numbered from
    ``first``, and write the CPU seconds it took, until stdin closes."""
    policy = policy_from_objects(policy_objects(args.queues, args.seed))
    config = AdmitConfig()
    _check(review(bodies(args.variant, 1, args.captures, -1)[0], policy, config).status)
    with heap.short_pauses():
        for line in sys.stdin:
            count, first = (int(word) for word in line.split())
            sent = bodies(args.variant, count, args.captures, first)
            start = time.process_time()
            for body in sent:
                review(body, policy, config)
            print(time.process_time() - start, flush=True)


def _worker_module(folder: Path) -> str:
    """This script's module in the checkout at ``folder``: checkouts from before the load
    test's sub-packages have it at the top of ``loadtest``."""
    if (folder / "loadtest" / "bench" / "review_cpu.py").is_file():
        return "loadtest.bench.review_cpu"
    return "loadtest.review_cpu"


class _Worker:
    """``--worker`` in the checkout at ``folder``, pinned to ``core``."""

    def __init__(self, folder: Path, args: argparse.Namespace, core: int) -> None:
        argv = [sys.executable, "-m", _worker_module(folder), "--worker"]
        argv += ["--variant", args.variant, "--queues", str(args.queues), "--seed"]
        argv += [str(args.seed), "--captures", str(args.captures)]
        self.process = subprocess.Popen(  # noqa: S603 - our interpreter, our arguments
            argv, cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        os.sched_setaffinity(self.process.pid, {core})
        if self.process.stdin is None or self.process.stdout is None:
            raise RuntimeError("the worker was started without pipes")
        self.stdin, self.stdout = self.process.stdin, self.process.stdout

    def batch(self, count: int, first: int) -> float:
        self.stdin.write(f"{count} {first}\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=60)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Both trees' workers on one core, taking turns in batches of ``--batch`` reviews,
    so that whatever else runs on the machine slows both alike; per run, the CPU time
    of each over ``--reviews`` reviews."""
    core = min(os.sched_getaffinity(0))
    mine, theirs = _Worker(Path.cwd(), args, core), _Worker(Path(args.against), args, core)
    try:
        ratios: list[float] = []
        per_mine: list[float] = []
        per_theirs: list[float] = []
        first = 0
        for _ in range(args.runs):
            spent = [0.0, 0.0]
            for turn in range(max(1, args.reviews // args.batch)):
                order = (0, 1) if turn % 2 else (1, 0)
                for side in order:
                    worker = mine if side == 0 else theirs
                    spent[side] += worker.batch(args.batch, first)
                first += args.batch  # both review the same bodies, each its first time
            reviewed = max(1, args.reviews // args.batch) * args.batch
            per_mine.append(spent[0] / reviewed)
            per_theirs.append(spent[1] / reviewed)
            ratios.append(spent[0] / spent[1])
    finally:
        mine.close()
        theirs.close()
    return {
        "variant": args.variant,
        "this_us": statistics.median(per_mine) * 1e6,
        "against_us": statistics.median(per_theirs) * 1e6,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.review_cpu",
        description="CPU per review of webhook.review_flow.review, in process",
    )
    add: Callable[..., Any] = parser.add_argument
    add("--variant", choices=VARIANTS, default="distinct")
    add("--reviews", type=int, default=2000, help="reviews per run (2000)")
    add("--runs", type=int, default=7, help="runs; the median is reported (7)")
    add("--queues", type=int, default=1000, help="LocalQueues in the generated policy")
    add("--seed", type=int, default=1, help="seed of the generated policy")
    add("--captures", type=Path, default=DEFAULT_CAPTURES, help="folder of the wire captures")
    add("--profile", type=int, default=0, help="print cProfile's top N functions instead")
    add("--against", type=Path, help="another checkout to compare with, run for run")
    add("--batch", type=int, default=100, help="--against: reviews per turn (100)")
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--json", action="store_true", help="print the result as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        serve_batches(args)
        return 0
    if args.profile:
        profile(args)
        return 0
    if args.against is not None:
        result = compare(args)
        if args.json:
            sys.stdout.buffer.write(jsonio.dumps(result) + b"\n")
        else:
            print(
                f"{args.variant}: this {result['this_us']:.0f} us/review, "
                f"{args.against} {result['against_us']:.0f} us/review, this/that "
                f"x{result['ratio_median']:.2f} (median of {args.runs} paired runs: "
                + ", ".join(f"{r:.2f}" for r in result["ratios"])
                + ")"
            )
        return 0
    runs = measure(args)
    if args.json:
        sys.stdout.buffer.write(jsonio.dumps({"variant": args.variant, "runs_s": runs}) + b"\n")
    else:
        print(
            f"{args.variant}: {statistics.median(runs) * 1e6:.0f} us/review (median of "
            f"{len(runs)} runs of {args.reviews}: "
            + ", ".join(f"{r * 1e6:.0f}" for r in runs)
            + ")"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
