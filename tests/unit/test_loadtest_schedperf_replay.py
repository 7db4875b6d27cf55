"""``loadtest.schedperf.replay``: sched-perf's pods replayed through the extender in process.

What a performance engineer relies on when quoting it: kube-scheduler's sample size, the
pods placed as the real loop places them (gang members in one rack, nothing beyond a
node's GPUs), and a CPU figure for every stage.
"""

from __future__ import annotations

import itertools

import pytest

from cluster.clock import ManualClock
from loadtest.schedperf.replay import STAGES, names_to_find, replay, report
from loadtest.schedperf.workload import GPUS_PER_NODE, PodShape


@pytest.mark.parametrize(
    ("nodes", "names"),
    [(50, 50), (500, 230), (1000, 420), (5000, 500), (10_000, 500), (20_000, 1000)],
)
def test_the_names_sent_are_as_many_as_kube_scheduler_looks_for(nodes: int, names: int) -> None:
    assert names_to_find(nodes) == names


def _ticks() -> itertools.count[float]:
    return itertools.count(0.0, 0.001)


def test_every_pod_with_room_is_placed_and_a_gang_shares_one_rack() -> None:
    gang = [PodShape(f"g-{k}", 8, 0, 48_000, 4096, gang="g", gang_size=3) for k in range(3)]
    singles = [PodShape(f"p-{k}", 1 + k % 4, 0, 4000, 4096) for k in range(20)]
    shares = [PodShape(f"s-{k}", 0, 300, 1000, 1024) for k in range(10)]
    pods = [*singles[:10], *gang, *shares, *singles[10:]]
    ticks = _ticks()
    result = replay(pods, 16, ManualClock(), lambda: next(ticks))
    assert result.placed == result.pods == len(pods)
    assert len(result.gang_racks["g"]) == 1
    assert all(result.cpu_s[stage] > 0 for stage in STAGES)
    assert "placed 33" in report([result], 16)


def test_pods_beyond_the_cluster_are_left_unplaced() -> None:
    pods = [PodShape(f"big-{k}", GPUS_PER_NODE, 0, 1000, 1024) for k in range(6)]
    ticks = _ticks()
    result = replay(pods, 4, ManualClock(), lambda: next(ticks))
    assert result.placed == 4  # one whole node each, and four nodes
    assert result.pods == 6
