"""The cluster-model self-check (``python -m loadtest selfcheck``): what it prints must add up."""

from __future__ import annotations

from pathlib import Path

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.pods import pod_from_json
from cluster.feed import CacheFeed
from cluster.model import PodDemand
from cluster.snapshot import Snapshot
from loadtest.demo import selfcheck
from loadtest.inputs.traces import TracePod, node_object, pod_object


def test_without_traces_the_selfcheck_runs_on_a_synthetic_fleet(tmp_path: Path) -> None:
    report = selfcheck.run(ManualClock(), tmp_path / "absent")
    assert report.source.startswith("a synthetic")
    assert (report.nodes, report.gpus) == (64, 512)
    # 110 % of capacity arrives: some pods must be turned away, most must land.
    assert report.skipped > 0
    assert report.placed > 10 * report.skipped
    assert 90.0 < report.allocated_pct <= 100.0


def test_best_fit_takes_the_fullest_node_that_still_fits() -> None:
    cache = ClusterCache(ManualClock())
    CacheFeed(cache).load([node_object(n) for n in selfcheck.synthetic_fleet(3)])
    first = pod_from_json(pod_object(TracePod("a", 1000, 1024, 2, 1000)))
    allocation = selfcheck.best_fit(cache.snapshot(), first.demand)
    assert allocation is not None
    cache.assume(first, allocation)
    second = selfcheck.best_fit(cache.snapshot(), PodDemand(gpus=1))
    assert second is not None
    assert second.node == allocation.node
    assert selfcheck.best_fit(Snapshot(), PodDemand(gpus=1)) is None
