"""The extender's scorers, one table each, and how ``prioritize`` puts them on the wire.

A scorer's absolute value matters less than the order it puts nodes in, so most rows
say "this node scores above that one" for a reason a cluster admin would recognise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from cluster.model import NodeState, PodDemand
from extender import decide
from extender.config import (
    DEFAULT_POD_MIX,
    ExtenderConfig,
    MixEntry,
    ScoringWeights,
    mix_from_demands,
)
from extender.gpus import fragmentation
from extender.scores import (
    MAX_SCORE,
    NEUTRAL_SCORE,
    Scorer,
    score_gang_locality,
    score_island_fit,
    score_node,
    score_packing,
)
from tests.unit.test_extender_builders import (
    CONFIG,
    NOW,
    RELAXED,
    context,
    demand,
    node,
    pod,
    snapshot,
)

ONE = (MixEntry(gpus=1),)
FOUR = (MixEntry(gpus=4),)
HALF = (MixEntry(gpu_milli=500),)
ONE_10C = (MixEntry(gpus=1, cpu_milli=10_000),)
HALF_10C = (MixEntry(gpu_milli=500, cpu_milli=10_000),)


# ---------------------------------------------------------------- fragmentation (FGD)


@pytest.mark.parametrize(
    ("layout", "mix", "islands_required", "expected"),
    [
        pytest.param(".... ....", ONE, True, 0, id="empty-node-serves-single-gpus"),
        pytest.param("5... ....", ONE, True, 500, id="half-used-gpu-strands-its-half"),
        pytest.param("5... ....", HALF, True, 0, id="a-half-fits-a-half"),
        pytest.param("3... ....", HALF, True, 300, id="too-small-for-a-half"),
        pytest.param("#### ####", ONE, True, 0, id="full-node-has-nothing-to-strand"),
        pytest.param("##.. ##..", FOUR, True, 4000, id="four-free-in-two-islands-serve-no-4"),
        pytest.param("##.. ##..", FOUR, False, 0, id="unless-islands-are-relaxed"),
        pytest.param("#... ....", FOUR, True, 3000, id="partial-island-stranded-for-4"),
        pytest.param("x... ....", ONE, True, 0, id="unhealthy-gpus-are-not-capacity"),
        pytest.param(
            "5... ....", (MixEntry(gpus=1, weight=3), MixEntry(gpu_milli=700)), True, 500, id="mix"
        ),
    ],
)
def test_fragmentation(
    layout: str, mix: tuple[MixEntry, ...], islands_required: bool, expected: float
) -> None:
    assert fragmentation(node(layout), mix, islands_required) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cpu_free", "expected"),
    [
        pytest.param(None, 0, id="cpu-unknown"),
        pytest.param(8000, 0, id="enough-cpu"),
        pytest.param(4000, 4000, id="too-little-cpu-strands-every-gpu"),
    ],
)
def test_fragmentation_counts_cpu_when_known(cpu_free: int | None, expected: float) -> None:
    mix = (MixEntry(gpus=1, cpu_milli=8000),)
    assert fragmentation(node("...."), mix, True, cpu_free) == expected


def test_packing_keeps_cpu_next_to_free_gpus() -> None:
    """A CPU-hungry pod goes where taking the CPU strands no GPU (FGD's Q-IV)."""
    mix = (MixEntry(gpus=1, cpu_milli=8000),)
    config = ExtenderConfig(levels=CONFIG.levels, pod_mix=mix)
    ctx = context(PodDemand(cpu_milli=8000), config=config)
    gpus_left = replace(node("#### ...."), cpu_milli=12000)
    no_gpus_left = replace(node("#### ####", "full"), cpu_milli=12000)
    assert score_packing(ctx, no_gpus_left) > score_packing(ctx, gpus_left)


def test_packing_weighs_the_cpu_other_pods_took_not_the_allocatable() -> None:
    """Two nodes alike but for the CPU their pods already hold (what the cache counts):
    the CPU-hungry pod goes where it strands no GPU, the node whose CPU is still free."""
    mix = (MixEntry(gpus=1, cpu_milli=8000),)
    config = ExtenderConfig(levels=CONFIG.levels, pod_mix=mix)
    ctx = context(PodDemand(cpu_milli=8000), config=config)
    roomy = replace(node("#### ...."), cpu_milli=96_000)
    crowded = replace(node("#### ....", "crowded"), cpu_milli=96_000, cpu_requested_milli=80_000)
    assert crowded.cpu_free_milli == 16_000
    assert score_packing(ctx, roomy) > score_packing(ctx, crowded)


@pytest.mark.parametrize(
    ("cpu_free", "stranding", "mix", "expected"),
    [
        # 4 free GPUs, pods of 1 GPU and 10 cores: 25 cores serve 2.5 of them
        pytest.param(40_000, 0.5, ONE_10C, 0, id="cpu-for-every-gpu"),
        pytest.param(25_000, 0.0, ONE_10C, 0, id="fgd-ignores-cpu-for-two"),
        pytest.param(20_000, 0.5, ONE_10C, 1000, id="two-gpus-half-lost"),
        pytest.param(25_000, 0.5, ONE_10C, 750, id="each-core-short-strands-a-part"),
        pytest.param(25_000, 1.0, ONE_10C, 1500, id="one-and-a-half-gpus-lost"),
        pytest.param(5_000, 0.5, ONE_10C, 4000, id="no-cpu-for-one-loses-all"),
        # GPUs free 300/1000/600/500, shares of 500 with 10 cores: 25 cores serve two
        # and a half GPUs; the half left over is of the least free (500); 300 is a
        # fragment anyway
        pytest.param(25_000, 0.5, HALF_10C, 300 + 0.5 * 250, id="shares-strand-least-free"),
        pytest.param(25_000, 0.0, HALF_10C, 300, id="shares-fgd"),
        pytest.param(None, 1.0, HALF_10C, 300, id="cpu-unknown-strands-nothing"),
    ],
)
def test_fragmentation_counts_gpus_the_cpu_cannot_serve(
    cpu_free: int | None, stranding: float, mix: tuple[MixEntry, ...], expected: float
) -> None:
    layout = "...." if mix is ONE_10C else "3.65"
    frag = fragmentation(node(layout), mix, True, cpu_free, stranding)
    assert frag == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mix", "expected"),
    [
        pytest.param((MixEntry(gpus=1, products=("A100",)),), 4000, id="other-product"),
        pytest.param((MixEntry(gpus=1, products=("A100", "H100")),), 0, id="accepted"),
        pytest.param((MixEntry(cpu_milli=4000),), 4000, id="no-gpu-pod-uses-none"),
        pytest.param(
            (MixEntry(gpus=1, weight=3), MixEntry(cpu_milli=4000)), 1000, id="weighted-in"
        ),
    ],
)
def test_fragmentation_by_product_and_for_pods_without_gpus(
    mix: tuple[MixEntry, ...], expected: float
) -> None:
    assert fragmentation(node("...."), mix, True) == pytest.approx(expected)


def test_packing_avoids_stranding_gpus_for_lack_of_cpu() -> None:
    """A CPU-only pod goes where its cores leave every free GPU its 10 cores."""
    config = ExtenderConfig(levels=CONFIG.levels, pod_mix=ONE_10C)
    ctx = context(PodDemand(cpu_milli=10_000), config=config)
    tight = replace(node("##.. ####"), cpu_milli=25_000)  # 2 free GPUs, 25 cores
    roomy = replace(node("##.. ####", "roomy"), cpu_milli=40_000)
    assert score_packing(ctx, roomy) > score_packing(ctx, tight)
    fgd = replace(config, cpu_stranding=0.0)
    ctx = context(PodDemand(cpu_milli=10_000), config=fgd)
    assert score_packing(ctx, roomy) == score_packing(ctx, tight)


def test_mix_from_demands_keeps_the_frequent_shapes() -> None:
    demands = [
        *[PodDemand(gpus=1, cpu_milli=11_300)] * 4,
        *[PodDemand(gpu_milli=470, cpu_milli=3000)] * 3,
        *[PodDemand(cpu_milli=4000)] * 2,
        PodDemand(gpu_milli=473, cpu_milli=3000, products=("T4",)),
    ]
    # 90 % of the pods: the three most frequent shapes, exact, CPU-only ones included
    assert mix_from_demands(demands, coverage=0.9) == (
        MixEntry(weight=2.0, cpu_milli=4000),
        MixEntry(gpu_milli=470, weight=3.0, cpu_milli=3000),
        MixEntry(gpus=1, weight=4.0, cpu_milli=11_300),
    )
    assert MixEntry(gpu_milli=473, cpu_milli=3000, products=("T4",)) in mix_from_demands(demands)
    assert mix_from_demands([PodDemand()]) == DEFAULT_POD_MIX
    assert mix_from_demands([]) == DEFAULT_POD_MIX


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: MixEntry(gpus=1, gpu_milli=500), "whole GPUs", id="both"),
        pytest.param(lambda: MixEntry(gpu_milli=1000), "whole GPUs", id="share-of-1000"),
        pytest.param(lambda: MixEntry(gpus=1, weight=0), "positive weight", id="no-weight"),
        pytest.param(
            lambda: ExtenderConfig(pod_mix=(MixEntry(cpu_milli=1000),)),
            "with GPUs",
            id="mix-without-gpus",
        ),
        pytest.param(lambda: ExtenderConfig(cpu_stranding=1.5), "0..1", id="stranding"),
        pytest.param(lambda: mix_from_demands([], coverage=0), "share", id="coverage"),
    ],
)
def test_invalid_mix_and_config_are_refused(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def scores(
    scorer: Scorer, want: PodDemand, layouts: list[str], config: ExtenderConfig = CONFIG
) -> list[float]:
    ctx = context(want, config=config)
    return [scorer(ctx, node(layout)) for layout in layouts]


# ---------------------------------------------------------------- packing


MIXED = ExtenderConfig(levels=CONFIG.levels)


@pytest.mark.parametrize(
    ("want", "better", "worse"),
    [
        pytest.param(demand(1), "#... ....", ".... ....", id="keep-whole-nodes-free"),
        pytest.param(demand(1), "###. ....", "#... ....", id="finish-a-nearly-full-island"),
        pytest.param(demand(4), "#### ....", ".... ....", id="large-job-fills-a-used-node"),
        pytest.param(demand(milli=500), "5... ....", "7... ....", id="no-sliver-left-behind"),
        pytest.param(demand(milli=500), "5... ....", ".... ....", id="share-packs-onto-used-gpu"),
        pytest.param(demand(2), "##.. ....", "#... ....", id="leave-no-lone-gpu-in-an-island"),
    ],
)
def test_packing_prefers(want: PodDemand, better: str, worse: str) -> None:
    good, bad = scores(score_packing, want, [better, worse], MIXED)
    assert good > bad


def test_packing_is_neutral_for_a_pod_without_gpus() -> None:
    assert scores(score_packing, PodDemand(), [".... ...."]) == [NEUTRAL_SCORE]


def test_packing_of_a_node_that_cannot_take_the_pod_is_zero() -> None:
    assert scores(score_packing, demand(8), ["#... ...."]) == [0.0]


# ---------------------------------------------------------------- island fit


@pytest.mark.parametrize(
    ("want", "layout", "config", "expected"),
    [
        pytest.param(demand(2), "##.. ....", CONFIG, 10.0, id="fills-island-exactly"),
        pytest.param(demand(2), ".... ....", CONFIG, 5.0, id="half-an-island"),
        pytest.param(demand(1), ".... ....", CONFIG, 2.5, id="quarter-island"),
        pytest.param(demand(8), ".... ....", CONFIG, 10.0, id="whole-node"),
        pytest.param(demand(4), "##.. ##..", RELAXED, 5.0, id="relaxed-split-is-halved"),
        pytest.param(demand(milli=300), "3... ....", CONFIG, 10.0, id="share-fills-gpu"),
        pytest.param(demand(milli=300), ".... ....", CONFIG, 3.0, id="share-on-whole-gpu"),
        pytest.param(PodDemand(), "....", CONFIG, NEUTRAL_SCORE, id="no-gpus"),
        pytest.param(demand(4), "#### ####", CONFIG, 0.0, id="does-not-fit"),
    ],
)
def test_island_fit(want: PodDemand, layout: str, config: ExtenderConfig, expected: float) -> None:
    assert scores(score_island_fit, want, [layout], config) == [pytest.approx(expected)]


# ---------------------------------------------------------------- gang locality


GANG_NODES = [
    node(".... ....", "a1", rack="r1", block="b1"),
    node(".... ....", "a2", rack="r1", block="b1"),
    node(".... ....", "b1", rack="r2", block="b1"),
    node(".... ....", "c1", rack="r3", block="b2"),
]


def member(topology: str | None = None, size: int = 4) -> PodDemand:
    return demand(2, gang="ns.job", size=size, topology=topology)


def locality(want: PodDemand, placed_on: list[str]) -> dict[str, float]:
    placed = [pod(f"m{i}", want, node=where, indices=(0, 1)) for i, where in enumerate(placed_on)]
    ctx = context(want, snap=snapshot(GANG_NODES, placed), name="new")
    return {n.name: score_gang_locality(ctx, n) for n in GANG_NODES}


def test_not_a_gang_ranks_no_node_above_another() -> None:
    ctx = context(demand(2), snap=snapshot(GANG_NODES))
    assert {score_gang_locality(ctx, n) for n in GANG_NODES} == {0.0}


def test_members_pull_the_next_one_closer_level_by_level() -> None:
    got = locality(member(), ["a1"])
    assert got["a1"] == MAX_SCORE
    assert got["a1"] > got["a2"] > got["b1"] > got["c1"] == 0.0


def test_preferred_level_outweighs_closeness_below_it() -> None:
    got = locality(member("preferred:block"), ["a1", "b1"])
    # c1 is in the other block: far below every node of block b1
    assert min(got["a1"], got["a2"], got["b1"]) > got["c1"]
    assert got["a1"] > got["a2"]


def test_first_member_prefers_a_domain_with_room_for_the_gang() -> None:
    nodes = [
        node("#### ####", "full", rack="r1"),
        node("##.. ....", "r1-room", rack="r1"),
        node(".... ....", "r2-a", rack="r2"),
        node(".... ....", "r2-b", rack="r2"),
    ]
    want = demand(4, gang="ns.job", size=4, topology="preferred:rack")
    ctx = context(want, snap=snapshot(nodes), name="m0")
    assert score_gang_locality(ctx, nodes[2]) == MAX_SCORE
    assert score_gang_locality(ctx, nodes[1]) == pytest.approx(MAX_SCORE / 4)


def test_first_member_without_topology_prefers_a_node_that_holds_the_gang() -> None:
    want = demand(2, gang="ns.job", size=4)
    ctx = context(want, snap=snapshot(GANG_NODES), name="m0")
    assert score_gang_locality(ctx, node(".... ....", "big")) == MAX_SCORE
    assert score_gang_locality(ctx, node("##.. ####", "small")) == pytest.approx(MAX_SCORE / 4)


# ---------------------------------------------------------------- combined and on the wire


@pytest.mark.parametrize(
    "weights",
    [
        ScoringWeights(),
        ScoringWeights(packing=1, island_fit=0, gang_locality=0),
        ScoringWeights(packing=0, island_fit=0, gang_locality=1),
    ],
)
def test_combined_score_stays_within_0_and_10(weights: ScoringWeights) -> None:
    config = ExtenderConfig(levels=CONFIG.levels, weights=weights)
    for layout in (".... ....", "#... ....", "5### ####", "x#x# ...."):
        for want in (demand(1), demand(milli=500), member()):
            score = score_node(context(want, config=config), node(layout))
            assert 0.0 <= score <= MAX_SCORE


@pytest.mark.parametrize(
    ("want", "weights"),
    [
        pytest.param(demand(1), ScoringWeights(), id="packing-alone"),
        pytest.param(demand(1), ScoringWeights(island_fit=5), id="packing-and-island"),
        pytest.param(member(), ScoringWeights(island_fit=5), id="gang-member"),
    ],
)
def test_combined_score_is_the_mean_of_the_scorers_that_judge_the_pod(
    want: PodDemand, weights: ScoringWeights
) -> None:
    """Gang locality does not judge a pod outside a gang: it does not pull its score
    towards 0 (which would leave packing a third of the range to rank nodes in)."""
    config = ExtenderConfig(levels=CONFIG.levels, weights=weights)
    ctx = context(want, config=config)
    n = node("#... ....")
    parts = [
        (weights.packing, score_packing(ctx, n)),
        (weights.island_fit, score_island_fit(ctx, n)),
    ]
    if want.gang is not None:
        parts.append((weights.gang_locality, score_gang_locality(ctx, n)))
    expected = sum(w * v for w, v in parts) / sum(w for w, _ in parts)
    assert score_node(ctx, n) == pytest.approx(expected)


def test_weights_choose_which_scorer_decides() -> None:
    packing_only = ExtenderConfig(
        levels=CONFIG.levels, weights=ScoringWeights(packing=1, island_fit=0, gang_locality=0)
    )
    ctx = context(demand(1), config=packing_only)
    for layout in (".... ....", "#... ...."):
        assert score_node(ctx, node(layout)) == pytest.approx(score_packing(ctx, node(layout)))


def test_invalid_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="not all 0"):
        ScoringWeights(packing=0, island_fit=0, gang_locality=0)
    with pytest.raises(ValueError, match=">= 0"):
        ScoringWeights(packing=-1)


def prioritized(layouts: dict[str, str], want: PodDemand, config: ExtenderConfig) -> dict[str, int]:
    nodes: list[NodeState] = [node(layout, name) for name, layout in layouts.items()]
    snap = snapshot(nodes)
    names = [*layouts, "missing"]
    got = decide.prioritize(snap, pod("p", want), names, config, NOW)
    assert len(got) == len(names)
    return dict(zip(names, got, strict=True))


def test_prioritize_spreads_fitting_nodes_over_1_to_10() -> None:
    got = prioritized(
        {"empty": ".... ....", "used": "#... ....", "full": "#### ####"}, demand(1), CONFIG
    )
    assert got == {"empty": 1, "used": 10, "full": 0, "missing": 0}


def test_prioritize_without_normalizing_rounds_each_score() -> None:
    config = ExtenderConfig(levels=CONFIG.levels, normalize_scores=False)
    layouts = {"empty": ".... ....", "used": "#... ...."}
    ctx = context(demand(1), config=config)
    expected = {name: round(score_node(ctx, node(lay, name))) for name, lay in layouts.items()}
    assert prioritized(layouts, demand(1), config) == expected | {"missing": 0}


def test_prioritize_gives_equal_nodes_the_top_score() -> None:
    got = prioritized({"a": "....", "b": "...."}, demand(1), CONFIG)
    assert got == {"a": 10, "b": 10, "missing": 0}


def test_score_nodes_gives_none_where_the_pod_does_not_fit() -> None:
    snap = snapshot([node("#### ####", "full"), node(".... ....", "free")])
    got = decide.score_nodes(snap, pod("p", demand(1)), ["full", "free"], CONFIG, NOW)
    assert got[0] is None
    assert got[1] is not None
