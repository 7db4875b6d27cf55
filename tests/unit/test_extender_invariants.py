"""Properties of the extender's decisions over any node, pod and gang hypothesis finds:

* every score is within 0..10, and every wire score an integer within 0..10;
* a node that passes the filters has a valid GPU assignment (the one bind takes): the
  right count of distinct, healthy GPUs with enough free, in one NVLink island when the
  pod fits in one; and a node whose GPU filter fails has none;
* preemption answers a subset of the proposed victims whose eviction really frees a
  placement, from which no victim holding GPUs could be spared; a node it drops is one
  where evicting every proposed victim would not be enough.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.model import (
    MILLI_PER_GPU,
    UNCONSTRAINED,
    Allocation,
    GangId,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    TopologyConstraint,
    TopologyMode,
)
from cluster.snapshot import Snapshot, apply_allocation, gpus_needed
from extender import decide
from extender.config import ExtenderConfig, ScoringWeights
from extender.context import FIT, Unfit
from extender.filters import filter_gpus, run_filters
from extender.gangs import build_context
from extender.gpus import choose_gpus, pod_fits
from extender.preemption import NodeVictims, Victim, preempt
from extender.scores import MAX_SCORE, SCORERS, score_node
from tests.builders import BLOCK_LABEL, H100, RACK_LABEL
from tests.unit.test_extender_builders import CONFIG, NOW, RELAXED, pod, snapshot

CONFIGS = st.sampled_from(
    [
        CONFIG,
        RELAXED,
        replace(CONFIG, weights=ScoringWeights(packing=1, island_fit=0, gang_locality=0)),
        replace(CONFIG, weights=ScoringWeights(packing=0, island_fit=5, gang_locality=1)),
        replace(CONFIG, normalize_scores=False),
    ]
)
FREE = st.sampled_from([0, 1, 100, 250, 300, 500, 700, 999, 1000, 1000, 1000, 1000])


@st.composite
def gpu_layouts(draw: st.DrawFn, *, all_free: bool = False) -> tuple[GpuDevice, ...]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    gpus: list[GpuDevice] = []
    for island, size in enumerate(sizes):
        for _ in range(size):
            healthy = draw(st.sampled_from([True, True, True, False]))
            free = MILLI_PER_GPU if all_free else draw(FREE)
            gpus.append(GpuDevice(len(gpus), island, healthy, free))
    return tuple(gpus)


@st.composite
def nodes(draw: st.DrawFn, name: str = "n", *, all_free: bool = False) -> NodeState:
    rack = draw(st.sampled_from(["r1", "r2"]))
    block = "b1" if rack == "r1" else draw(st.sampled_from(["b1", "b2"]))
    domains = {RACK_LABEL: rack, BLOCK_LABEL: block}
    return NodeState(
        name=NodeName(name),
        gpus=draw(gpu_layouts(all_free=all_free)),
        product=H100,
        domains=domains,
        labels=domains,
    )


DEMANDS = st.one_of(
    # mostly sizes that fit some island, where the one-island rule has work to do
    st.sampled_from([1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 8, 9]).map(lambda k: PodDemand(gpus=k)),
    st.integers(1, 999).map(lambda m: PodDemand(gpu_milli=m)),
    st.just(PodDemand()),
)
TOPOLOGIES = st.sampled_from(
    [
        None,
        TopologyConstraint(TopologyMode.REQUIRED, "rack"),
        TopologyConstraint(TopologyMode.REQUIRED, "block"),
        TopologyConstraint(TopologyMode.PREFERRED, "rack"),
        TopologyConstraint(TopologyMode.REQUIRED, "zone"),
    ]
)


def valid_assignment(node: NodeState, demand: PodDemand, config: ExtenderConfig) -> bool:
    chosen = choose_gpus(node, demand, config)
    if chosen is None:
        return False
    if not demand.uses_gpu:
        return chosen == ()
    gpus = {gpu.index: gpu for gpu in node.gpus}
    if len(chosen) != gpus_needed(demand) or len(set(chosen)) != len(chosen):
        return False
    if chosen != tuple(sorted(chosen)):
        return False
    for index in chosen:
        gpu = gpus.get(index)
        if gpu is None or not gpu.healthy or gpu.free_milli < demand.milli_per_gpu:
            return False
    healthy_per_island: dict[int, int] = {}
    for gpu in node.gpus:
        healthy_per_island[gpu.island] = healthy_per_island.get(gpu.island, 0) + gpu.healthy
    if demand.gpus and config.islands_required and demand.gpus <= max(healthy_per_island.values()):
        return len({gpus[i].island for i in chosen}) == 1
    return True


# ---------------------------------------------------------------- one node


@given(node=nodes(), demand=DEMANDS, config=CONFIGS)
def test_scores_are_always_within_0_and_10(
    node: NodeState, demand: PodDemand, config: ExtenderConfig
) -> None:
    ctx = build_context(snapshot([node]), pod("p", demand), config, NOW)
    for scorer in SCORERS.values():
        assert 0.0 <= scorer(ctx, node) <= MAX_SCORE
    assert 0.0 <= score_node(ctx, node) <= MAX_SCORE


@given(node=nodes(), demand=DEMANDS, config=CONFIGS)
def test_the_gpu_filter_passes_exactly_when_gpus_can_be_chosen(
    node: NodeState, demand: PodDemand, config: ExtenderConfig
) -> None:
    ctx = build_context(Snapshot(), pod("p", demand), config, NOW)
    passes = filter_gpus(ctx, node) is FIT
    assert passes == (choose_gpus(node, demand, config) is not None)
    if passes:
        assert valid_assignment(node, demand, config)
    if demand.uses_gpu:
        assert passes == (pod_fits(node, demand, config.islands_required) >= 1)


@given(node=nodes(), demand=DEMANDS, config=CONFIGS)
def test_a_node_with_every_gpu_free_fails_only_for_good(
    node: NodeState, demand: PodDemand, config: ExtenderConfig
) -> None:
    emptied = replace(node, gpus=tuple(replace(gpu, free_milli=MILLI_PER_GPU) for gpu in node.gpus))
    ctx = build_context(Snapshot(), pod("p", demand), config, NOW)
    verdict = filter_gpus(ctx, emptied)
    # nothing held by other pods: a failure is one no preemption could fix
    assert verdict is FIT or (isinstance(verdict, Unfit) and not verdict.resolvable)
    used = filter_gpus(ctx, node)
    if verdict is FIT and isinstance(used, Unfit):
        assert used.resolvable


# ---------------------------------------------------------------- a small cluster with a gang


@st.composite
def gang_clusters(draw: st.DrawFn) -> tuple[Snapshot, PodInfo]:
    members = [draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 4)))]
    size = draw(st.integers(1, 6))
    want = replace(
        draw(DEMANDS.filter(lambda d: d.uses_gpu)),
        gang=GangSpec(GangId("ns.g"), size, draw(st.integers(1, size))),
        topology=draw(TOPOLOGIES),
    )
    placed: list[PodInfo] = []
    current = {n.name: n for n in members}
    for i in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(sorted(current)))
        chosen = choose_gpus(current[where], want, RELAXED)
        if chosen:
            placed.append(pod(f"m{i}", want, node=where, indices=chosen))
            allocation = Allocation(where, chosen, want.milli_per_gpu)
            current[where] = apply_allocation(current[where], allocation, 1)
    return snapshot(members, placed), pod("new", want)


@settings(max_examples=60)
@given(cluster=gang_clusters(), config=CONFIGS)
def test_a_node_that_passes_every_filter_can_be_bound(
    cluster: tuple[Snapshot, PodInfo], config: ExtenderConfig
) -> None:
    snap, new = cluster
    ctx = build_context(snap, new, config, NOW)
    for node in snap.nodes.values():
        assert 0.0 <= score_node(ctx, node) <= MAX_SCORE
        if run_filters(ctx, node) is FIT:
            assert valid_assignment(node, new.demand, config)
            plan = decide.plan_bind(snap, new, node.name, config, NOW)
            assert isinstance(plan, decide.BindPlan)
            assert plan.allocation is not None
            assert plan.allocation.indices == choose_gpus(node, new.demand, config)
    wire = decide.prioritize(snap, new, sorted(snap.nodes), config, NOW)
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in wire)


@given(cluster=gang_clusters(), config=CONFIGS)
def test_the_node_chosen_in_filter_fits_and_scores_best_first_named_among_equals(
    cluster: tuple[Snapshot, PodInfo], config: ExtenderConfig
) -> None:
    snap, new = cluster
    new = replace(new, demand=replace(new.demand, selection=UNCONSTRAINED))
    config = replace(config, choose_in_filter=True)
    outcome = decide.filter_nodes(snap, new, sorted(snap.nodes), config, NOW)
    narrowed = decide.choose(snap, new, outcome, config, NOW)
    assert replace(narrowed, chosen=None) == outcome
    if len(outcome.fits) < 2:
        assert narrowed.chosen is None
        return
    scores = dict(
        zip(outcome.fits, decide.score_nodes(snap, new, outcome.fits, config, NOW), strict=True)
    )
    best = max(s for s in scores.values() if s is not None)
    assert narrowed.chosen == next(name for name in outcome.fits if scores[name] == best)


# ---------------------------------------------------------------- preemption


@st.composite
def preemptions(draw: st.DrawFn) -> tuple[Snapshot, PodInfo, dict[str, NodeVictims]]:
    node = draw(nodes("n", all_free=True))
    held: list[PodInfo] = []
    current = node
    for i in range(draw(st.integers(0, 7))):
        want = draw(DEMANDS.filter(lambda d: d.uses_gpu))
        chosen = choose_gpus(current, want, RELAXED)
        if chosen:
            held.append(pod(f"v{i}", want, node="n", indices=chosen))
            current = apply_allocation(
                current, Allocation(node.name, chosen, want.milli_per_gpu), 1
            )
    proposed = draw(st.lists(st.sampled_from(held), unique_by=lambda p: p.key)) if held else []
    victims = [Victim(p.uid) for p in proposed]
    if draw(st.booleans()):
        victims.append(Victim("uid-not-a-gpu-pod"))
    proposals = {"n": NodeVictims(tuple(victims), draw(st.integers(0, 3)))}
    return snapshot([node], held), pod("p", draw(DEMANDS)), proposals


def evicted(snap: Snapshot, uids: set[str]) -> NodeState:
    node = snap.nodes[NodeName("n")]
    for key, allocation in snap.allocations.items():
        if snap.pods[key].uid in uids:
            node = apply_allocation(node, allocation, -1)
    return node


@settings(max_examples=150)
@given(case=preemptions(), config=st.sampled_from([CONFIG, RELAXED]))
def test_preempt_answers_the_fewest_proposed_victims_that_really_free_a_placement(
    case: tuple[Snapshot, PodInfo, dict[str, NodeVictims]], config: ExtenderConfig
) -> None:
    snap, preemptor, proposals = case
    answer = preempt(snap, preemptor, proposals, config, NOW)
    ctx = build_context(snap, preemptor, config, NOW)
    proposed = proposals["n"]
    all_uids = {v.uid for v in proposed.pods}
    if NodeName("n") not in answer:
        assert run_filters(ctx, evicted(snap, all_uids)) is not FIT
        return
    kept = answer[NodeName("n")]
    assert set(kept.pods) <= set(proposed.pods)
    assert list(kept.pods) == [v for v in proposed.pods if v in kept.pods]
    assert kept.pdb_violations <= proposed.pdb_violations
    uids = {v.uid for v in kept.pods}
    assert run_filters(ctx, evicted(snap, uids)) is FIT
    holders = {snap.pods[key].uid for key in snap.allocations}
    for uid in uids & holders:
        assert run_filters(ctx, evicted(snap, uids - {uid})) is not FIT, f"{uid} was spared"
