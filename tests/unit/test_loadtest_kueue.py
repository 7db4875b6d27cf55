"""The load test's Kueue: quota per ClusterQueue and flavor, borrowing in a cohort, FIFO.

Hand-made cohorts small enough to check every number by eye, and an invariant over
random arrivals and departures: no queue ever holds more than nominal + borrowing limit,
and the cohort never holds more than its nominal quota in total.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import labels
from loadtest.sim import kueue

GPU = labels.GPU_RESOURCE


def cq(
    name: str,
    *flavors: tuple[str, int, int | None, int | None],
    cohort: str | None = "pool",
    strict: bool = False,
) -> dict[str, Any]:
    """A ClusterQueue; each flavor is (name, nominal, borrowingLimit, lendingLimit)."""
    resources = []
    for flavor, nominal, borrow, lend in flavors:
        gpu: dict[str, Any] = {"name": GPU, "nominalQuota": str(nominal)}
        if borrow is not None:
            gpu["borrowingLimit"] = str(borrow)
        if lend is not None:
            gpu["lendingLimit"] = str(lend)
        resources.append({"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "9"}, gpu]})
    spec: dict[str, Any] = {
        "resourceGroups": [{"coveredResources": ["cpu", GPU], "flavors": resources}],
        "queueingStrategy": "StrictFIFO" if strict else "BestEffortFIFO",
    }
    if cohort is not None:
        spec["cohortName"] = cohort
    return {"kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def book(*queues: dict[str, Any]) -> kueue.QuotaBook:
    return kueue.QuotaBook(kueue.setup_from_objects(queues))


def wl(seq: int, queue: str, gpus: int, flavors: set[str] | None = None) -> kueue.Workload:
    allowed = None if flavors is None else frozenset(flavors)
    return kueue.Workload(f"{queue}-{seq}", queue, GPU, gpus, allowed, seq)


def admitted(b: kueue.QuotaBook, pending: list[kueue.Workload]) -> list[tuple[str, str, bool]]:
    return [(a.workload.key, a.flavor, a.borrowed) for a in kueue.admit_pending(b, pending)]


def test_reads_quota_and_limits_from_the_objects() -> None:
    setup = kueue.setup_from_objects([cq("a", ("h100", 4, 2, 1)), cq("b", ("h100", 8, None, None))])
    quota = setup.cluster_queues["a"].quotas[("h100", GPU)]
    assert (quota.nominal, quota.borrowing_limit, quota.lending_limit) == (4, 2, 1)
    assert setup.cluster_queues["b"].quotas[("h100", GPU)].borrowing_limit is None
    assert setup.cluster_queues["a"].cohort == "pool"


def test_fifo_within_nominal_then_borrowing_up_to_the_limit() -> None:
    b = book(cq("a", ("h100", 4, 2, None)), cq("b", ("h100", 4, None, None)))
    pending = [wl(1, "a", 3), wl(2, "a", 2), wl(3, "a", 1), wl(4, "a", 1)]
    # 3 in nominal; 2 more borrows 1 (4+1=5); 1 more borrows 2 (limit); the last would be 3.
    assert admitted(b, pending) == [
        ("a-1", "h100", False),
        ("a-2", "h100", True),
        ("a-3", "h100", True),
    ]
    assert b.usage("a", "h100", GPU) == 6


def test_borrowing_is_capped_by_what_the_others_lend() -> None:
    b = book(cq("a", ("h100", 4, None, None)), cq("b", ("h100", 4, None, 1)))
    assert admitted(b, [wl(1, "a", 5)]) == [("a-1", "h100", True)]
    assert admitted(b, [wl(2, "a", 1)]) == []  # b lends at most 1


def test_borrowing_shrinks_as_the_lender_uses_its_own_quota() -> None:
    b = book(cq("a", ("h100", 4, None, None)), cq("b", ("h100", 4, None, None)))
    assert admitted(b, [wl(1, "b", 3)]) == [("b-1", "h100", False)]
    assert admitted(b, [wl(2, "a", 6)]) == []  # b has only 1 unused
    assert admitted(b, [wl(3, "a", 5)]) == [("a-3", "h100", True)]


def test_no_cohort_means_no_borrowing() -> None:
    b = book(cq("a", ("h100", 4, 4, None), cohort=None))
    assert admitted(b, [wl(1, "a", 5)]) == []


def test_best_effort_fifo_lets_a_smaller_job_pass_a_blocked_head() -> None:
    b = book(cq("a", ("h100", 4, 0, None)))
    assert admitted(b, [wl(1, "a", 6), wl(2, "a", 2)]) == [("a-2", "h100", False)]


def test_strict_fifo_stops_at_a_blocked_head() -> None:
    b = book(cq("a", ("h100", 4, 0, None), strict=True))
    assert admitted(b, [wl(1, "a", 6), wl(2, "a", 2)]) == []


def test_the_first_flavor_with_room_is_taken_in_the_queue_order() -> None:
    b = book(cq("a", ("reserved", 2, 0, None), ("spot", 8, 0, None), cohort=None))
    assert admitted(b, [wl(1, "a", 2), wl(2, "a", 2)]) == [
        ("a-1", "reserved", False),
        ("a-2", "spot", False),
    ]


def test_a_flavor_the_job_may_not_use_is_skipped() -> None:
    b = book(cq("a", ("reserved", 8, 0, None), ("spot", 8, 0, None), cohort=None))
    assert admitted(b, [wl(1, "a", 1, {"spot"})]) == [("a-1", "spot", False)]


def test_releasing_quota_admits_the_next_in_line() -> None:
    b = book(cq("a", ("h100", 4, 0, None), cohort=None))
    assert admitted(b, [wl(1, "a", 4)]) == [("a-1", "h100", False)]
    assert admitted(b, [wl(2, "a", 3)]) == []
    b.release("a", "h100", GPU, 4)
    assert admitted(b, [wl(2, "a", 3)]) == [("a-2", "h100", False)]
    with pytest.raises(ValueError, match="released more"):
        b.release("a", "h100", GPU, 4)


def test_queues_take_turns_for_the_borrowable_quota() -> None:
    b = book(
        cq("a", ("h100", 2, None, None)),
        cq("b", ("h100", 2, None, None)),
        cq("idle", ("h100", 2, None, None)),
    )
    pending = [wl(1, "a", 2), wl(2, "a", 1), wl(3, "a", 1), wl(4, "b", 2), wl(5, "b", 1)]
    keys = [key for key, _, _ in admitted(b, pending)]
    # 6 GPUs in the cohort: a and b each get their 2, then one borrowed GPU each.
    assert sorted(keys) == ["a-1", "a-2", "b-4", "b-5"]


def test_a_lender_cannot_reclaim_while_others_borrow_its_quota() -> None:
    """No preemption in this model: the cohort never holds more than its nominal total."""
    b = book(cq("a", ("h100", 4, None, None)), cq("b", ("h100", 4, None, None)))
    assert admitted(b, [wl(1, "a", 8)]) == [("a-1", "h100", True)]
    assert admitted(b, [wl(2, "b", 1)]) == []


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 6), st.booleans()),
        max_size=40,
    )
)
def test_no_queue_and_no_cohort_ever_exceeds_its_quota(steps: list[tuple[str, int, bool]]) -> None:
    b = book(
        cq("a", ("h100", 4, 2, None)),
        cq("b", ("h100", 6, None, 2)),
        cq("c", ("h100", 2, 8, None)),
    )
    limits = {"a": 6, "b": 10**9, "c": 10}
    nominal = {"a": 4, "b": 6, "c": 2}
    lend = {"a": 4, "b": 2, "c": 2}
    running: list[kueue.Admission] = []
    pending: list[kueue.Workload] = []
    for seq, (queue, gpus, finish_one) in enumerate(steps):
        pending.append(wl(seq, queue, gpus))
        if finish_one and running:
            done = running.pop(0)
            b.release(done.workload.cluster_queue, done.flavor, GPU, done.workload.amount)
        for admission in kueue.admit_pending(b, pending):
            pending.remove(admission.workload)
            running.append(admission)
        for name, limit in limits.items():
            assert b.usage(name, "h100", GPU) <= limit
        assert sum(b.usage(n, "h100", GPU) for n in limits) <= 12
        # Everything borrowed is covered by what the lenders leave unused (b: at most 2).
        borrowed = sum(max(0, b.usage(n, "h100", GPU) - q) for n, q in nominal.items())
        lendable = sum(
            min(max(0, q - b.usage(n, "h100", GPU)), lend[n]) for n, q in nominal.items()
        )
        assert borrowed <= lendable
