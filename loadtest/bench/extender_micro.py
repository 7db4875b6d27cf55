"""The extender's decisions timed in process: each stage of ``/filter``, ``/prioritize``
and ``/bind``'s plan on their own (``micro``), and whole verbs over growing fleets
(``sweep``).

Layer: ROOT (times the extender's PURE code with the injected ``Clock``, writes temporary
cluster files). Part of ``bench-extender``; must not change the snapshot or the decisions
it times.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from cluster.cache import ClusterCache
from cluster.clock import Clock
from cluster.feed import CacheFeed
from cluster.snapshot import Snapshot
from extender import decide, verbs, wire
from extender.config import ExtenderConfig
from extender.memo import DecisionCache
from extender.settings import ExtenderSettings
from loadtest.bench.extender_cluster import LEVELS, Cluster, args_body, probe_pod, write_cluster
from loadtest.measure.pinned import proc_memory
from loadtest.measure.stats import Histogram, Summary
from server import heap

MIB: Final = 1024 * 1024


def config_of() -> ExtenderConfig:
    return ExtenderSettings(topology_levels=LEVELS).to_config()  # type: ignore[arg-type]


def load_cache(path: Path, clock: Clock, config: ExtenderConfig) -> ClusterCache:
    cache = ClusterCache(clock)
    CacheFeed(cache, levels=config.level_labels).load_file(path)
    return cache


def timed(clock: Clock, work: Callable[[], object], budget_s: float, at_least: int = 20) -> Summary:
    """Run ``work`` until ``budget_s`` is spent (and ``at_least`` times); its timings.

    A few untimed runs first: the first one fills the memos for its pod shape, a cost
    the cycle and the sweep show, which would otherwise sit in every stage's tail.
    """
    for _ in range(3):
        work()
    times: list[float] = []
    start = clock.monotonic()
    while len(times) < at_least or clock.monotonic() - start < budget_s:
        began = clock.monotonic()
        work()
        times.append(clock.monotonic() - began)
        if len(times) >= 5000:
            break
    return Histogram.of(times).summary()


def micro(
    cache: ClusterCache, cluster: Cluster, config: ExtenderConfig, clock: Clock, budget_s: float
) -> list[tuple[str, Summary]]:
    """Each stage of /filter and /prioritize on their own, then /bind's plan."""
    snapshot = cache.snapshot()
    now = clock.now()
    memo = DecisionCache(config)  # the server keeps one per config, across requests
    rng = random.Random(7)
    rows: list[tuple[str, Summary]] = []

    def stage(label: str, work: Callable[[], object]) -> None:
        rows.append((label, timed(clock, work, budget_s)))

    for shape, pod_json in (("1 GPU", probe_pod(1)), ("share 200m", probe_pod(0, 200))):
        for count in (500, len(cluster.names)):
            names = (
                cluster.names if count >= len(cluster.names) else rng.sample(cluster.names, count)
            )
            tag = f"{shape}, {count} names"
            _verb_stages(
                stage, tag, pod_json, names, snapshot=snapshot, config=config, now=now, memo=memo
            )
    plans = _bind_plans(cluster, snapshot, config, now, memo)
    turn = iter(range(10**9))

    def plan_one() -> object:
        return verbs.plan_bind(plans[next(turn) % len(plans)], snapshot, config, now, memo=memo)

    stage(f"bind plan (verbs.plan_bind, {len(plans)} pending pods)", plan_one)
    return rows


def _verb_stages(
    stage: Callable[[str, Callable[[], object]], None],
    tag: str,
    pod_json: dict[str, Any],
    names: Sequence[str],
    *,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    memo: DecisionCache,
) -> None:
    """/filter's and /prioritize's stages for one pod and one set of names."""
    body = args_body(pod_json, names)
    args = wire.decode_extender_args(body)
    pod, candidates = args.pod, args.node_names or ()
    outcome = decide.filter_nodes(snapshot, pod, candidates, config, now, memo=memo)
    scores = decide.prioritize(snapshot, pod, outcome.fits, config, now, memo=memo)
    fits_body = args_body(pod_json, outcome.fits)
    stage(f"decode ExtenderArgs ({tag})", partial(wire.decode_extender_args, body))
    stage(
        f"filter core ({tag})",
        partial(decide.filter_nodes, snapshot, pod, candidates, config, now, memo=memo),
    )
    stage(f"encode filter result ({tag})", partial(wire.encode_filter, args, outcome))
    stage(
        f"/filter whole verb ({tag})",
        partial(verbs.handle_filter, body, snapshot, config, now, memo=memo),
    )
    stage(
        f"score core, {len(outcome.fits)} fitting ({tag})",
        partial(decide.prioritize, snapshot, pod, outcome.fits, config, now, memo=memo),
    )
    stage(f"encode priorities ({tag})", partial(wire.encode_priorities, outcome.fits, scores))
    stage(
        f"/prioritize whole verb, all names ({tag})",
        partial(verbs.handle_prioritize, body, snapshot, config, now, memo=memo),
    )
    stage(
        f"/prioritize whole verb, fitting only ({tag})",
        partial(verbs.handle_prioritize, fits_body, snapshot, config, now, memo=memo),
    )


def _bind_plans(
    cluster: Cluster,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    memo: DecisionCache,
) -> list[bytes]:
    """Bindings of pending pods (shares, whole GPUs, gang members) on a node they fit."""
    plans: list[bytes] = []
    for pod_json in cluster.pending[:200]:
        meta = pod_json["metadata"]
        args = wire.decode_extender_args(args_body(pod_json, cluster.names[:500]))
        outcome = decide.filter_nodes(
            snapshot, args.pod, args.node_names or (), config, now, memo=memo
        )
        if outcome.fits:
            binding = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": outcome.fits[0],
            }
            plans.append(jsonio.dumps(binding))
    return plans


def sweep(
    sizes: Sequence[int], pods_per_node: int, seed: int, clock: Clock, budget_s: float
) -> list[str]:
    """Whole-verb p50 with all names at each fleet size (``pods_per_node`` pods each)."""
    lines = [
        f"{'nodes':>6} {'pods':>7} {'filter p50':>11} {'us/node':>8} "
        f"{'prio p50':>9} {'us/node':>8} {'RSS':>7}"
    ]
    config = config_of()
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            cluster = write_cluster(Path(folder) / "c.json", size, size * pods_per_node, seed)
            cache = load_cache(cluster.path, clock, config)
        view, now = cache.snapshot(), clock.now()
        memo = DecisionCache(config)
        body = args_body(probe_pod(1), cluster.names)
        with heap.short_pauses():  # as the server collects
            f = timed(
                clock,
                partial(verbs.handle_filter, body, view, config, now, memo=memo),
                budget_s,
                10,
            )
            p = timed(
                clock,
                partial(verbs.handle_prioritize, body, view, config, now, memo=memo),
                budget_s,
                10,
            )
        rss = proc_memory(os.getpid()).get("VmRSS", 0) / MIB
        lines.append(
            f"{size:>6} {size * pods_per_node:>7} {f.p50 * 1e3:>9.2f}ms {f.p50 / size * 1e6:>8.2f} "
            f"{p.p50 * 1e3:>7.2f}ms {p.p50 / size * 1e6:>8.2f} {rss:>5.0f}MB"
        )
    return lines
