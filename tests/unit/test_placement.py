"""The placement harness's own arithmetic (the FGD artifact's method), on tiny clusters
whose answers are computed by hand: the allocation metric, the arrival sequence's stop
rule, BestFit's score, the tie-break, skipping, and Tessera's nodes built from trace rows
exactly as the extender's converter builds them from Node objects."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.convert.nodes import node_from_json
from cluster.model import PodKey
from extender.config import ExtenderConfig, mix_from_demands
from extender.context import PodContext
from extender.memo import DecisionCache
from extender.scores import score_node
from loadtest.inputs.asks import PodAsk
from loadtest.inputs.seeds import parse_seeds
from loadtest.inputs.traces import TraceNode, node_object
from loadtest.placement import fgd
from loadtest.placement.policies import (
    NO_FIT,
    NOW,
    BestFit,
    Cluster,
    Fgd,
    Policy,
    RandomFit,
    Tessera,
    demand_of,
    node_state,
)
from loadtest.placement.study import play, wire_best

CPU_POD = PodAsk(cpu_milli=4000, memory_mib=1024, num_gpu=0, gpu_milli=0)


def gpu_pod(num: int = 1, milli: int = 1000, cpu: int = 4000, spec: tuple[str, ...] = ()) -> PodAsk:
    return PodAsk(cpu_milli=cpu, memory_mib=1024, num_gpu=num, gpu_milli=milli, gpu_spec=spec)


def tnode(name: str, gpus: int = 1, model: str = "T4", cpu: int = 32000) -> TraceNode:
    return TraceNode(name=name, cpu_milli=cpu, memory_mib=131072, gpus=gpus, model=model)


def run(
    nodes: Sequence[TraceNode],
    pods: Sequence[PodAsk],
    policy: Policy | None = None,
    tie: Sequence[int] | None = None,
) -> tuple[list[tuple[int, int]], dict[str, int], Cluster]:
    cluster = Cluster.of(nodes)
    played = play(
        cluster,
        pods,
        policy or BestFit(),
        tie if tie is not None else list(range(len(nodes), 0, -1)),
        random.Random(0),
    )
    return played.points, played.skipped, played.cluster


# ---------------------------------------------------------------- the metric


def test_two_nodes_hand_computed_curve() -> None:
    # 2 nodes x 1 GPU = 2000 milli. A GPU (50 % arrived, 50 % allocated), a CPU pod
    # (still 50/50), a second GPU (100/100), a half GPU that fits nowhere (125/100).
    points, skipped, _ = run(
        [tnode("a"), tnode("b")], [gpu_pod(), CPU_POD, gpu_pod(), gpu_pod(milli=500)]
    )
    assert points == [(1000, 1000), (1000, 1000), (2000, 2000), (2500, 2000)]
    assert skipped == {"share": 1}
    assert fgd.allocation_curve(points, 2000) == {50: 50.0, 100: 100.0, 125: 100.0}


def test_the_value_at_x_is_the_mean_over_the_pods_whose_arrived_percent_rounds_to_x() -> None:
    # 995 and 1004 of 1000 both round to 100 %; 1005 rounds up to 101 % (half away from 0)
    points = [(995, 900), (1000, 950), (1004, 1000), (1005, 1000)]
    assert fgd.allocation_curve(points, 1000) == {100: 95.0, 101: 100.0}


@pytest.mark.parametrize(
    ("arrived", "capacity", "percent"),
    [(5, 1000, 1), (4, 1000, 0), (15, 1000, 2), (1295, 1000, 130), (1294, 1000, 129)],
)
def test_arrived_percent_rounds_halves_up(arrived: int, capacity: int, percent: int) -> None:
    assert fgd.arrived_percent(arrived * 10, capacity * 10) == percent


def test_median_of_even_and_odd_counts() -> None:
    assert fgd.median([3.0, 1.0, 2.0]) == 2.0
    assert fgd.median([4.0, 1.0, 2.0, 3.0]) == 2.5


# ---------------------------------------------------------------- the sequence


@given(
    demands=st.lists(st.sampled_from([0, 100, 500, 1000, 2000, 8000]), min_size=1, max_size=30),
    capacity=st.integers(min_value=1000, max_value=20000),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_sequence_is_the_shuffled_trace_then_draws_until_the_next_would_pass_130(
    demands: list[int], capacity: int, seed: int
) -> None:
    if not any(demands):
        demands = [*demands, 1000]  # draws of nothing alone would never stop
    order = fgd.arrival_sequence(demands, capacity, random.Random(seed))
    n = len(demands)
    assert sorted(order[:n]) == list(range(n))
    arrived = sum(demands[i] for i in order)
    extra = order[n:]
    if extra:
        assert arrived <= 1.3 * capacity
    # replay the same random stream: the draw after the last one taken would pass 130 %
    replay = random.Random(seed)
    replay.shuffle(list(range(n)))
    for taken in extra:
        assert replay.randrange(n) == taken
    assert arrived + demands[replay.randrange(n)] > 1.3 * capacity


def test_a_trace_above_130_percent_is_still_played_whole() -> None:
    order = fgd.arrival_sequence([1000, 1000], 1000, random.Random(1))
    assert sorted(order) == [0, 1]


# ---------------------------------------------------------------- scores and choices


@pytest.mark.parametrize(
    ("cpu_free", "cpu_req", "gpu_free", "gpu_req", "score"),
    [
        (16000, 16000, 1000, 1000, 100),  # fills the node exactly
        (64000, 16000, 8000, 1000, 37),  # 100 * (1 - 0.5*48/128 - 0.5*7/8) = 37.5
        (128000, 0, 8000, 0, 0),
        (96000, 8000, 8000, 500, 18),  # 100 * (1 - 0.34375 - 0.46875) = 18.75
    ],
)
def test_bestfit_score_is_the_readme_formula_truncated(
    cpu_free: int, cpu_req: int, gpu_free: int, gpu_req: int, score: int
) -> None:
    assert fgd.bestfit_score(cpu_free, cpu_req, gpu_free, gpu_req) == score


def test_bestfit_prefers_the_node_with_less_left() -> None:
    _, _, cluster = run([tnode("big", gpus=8), tnode("small", gpus=1)], [gpu_pod()])
    assert cluster.gpus == [[1000] * 8, [0]]


def test_ties_go_to_the_better_ranked_node_and_follow_the_ranks() -> None:
    nodes = [tnode("a"), tnode("b"), tnode("c")]
    for winner in range(3):
        tie = [10 if n == winner else n for n in range(3)]
        _, _, cluster = run(nodes, [gpu_pod()], tie=tie)
        assert [frees[0] for frees in cluster.gpus] == [
            0 if n == winner else 1000 for n in range(3)
        ]


def test_a_pod_that_fits_nowhere_is_skipped_and_later_pods_still_place() -> None:
    nodes = [tnode("a", gpus=2, cpu=8000)]
    pods = [gpu_pod(num=4), gpu_pod(cpu=16000), gpu_pod(spec=("V100M32",)), gpu_pod()]
    points, skipped, cluster = run(nodes, pods)
    assert skipped == {"4gpu": 1, "1gpu": 2}
    assert points[-1] == (7000, 1000)
    assert cluster.gpus == [[0, 1000]]


def test_the_gpu_spec_is_a_hard_filter() -> None:
    nodes = [tnode("t4", model="T4", gpus=8), tnode("v100", model="V100M32")]
    _, _, cluster = run(nodes, [gpu_pod(spec=("V100M16", "V100M32"))])
    assert cluster.gpus[1] == [0]


def test_baselines_take_the_tightest_gpu_for_a_share() -> None:
    _, _, cluster = run([tnode("a", gpus=3)], [gpu_pod(milli=600), gpu_pod(milli=300)])
    assert cluster.gpus == [[100, 1000, 1000]]


def test_pod_count_fits_like_kube_scheduler() -> None:
    cluster = Cluster.of([tnode("a")])
    cluster.pods[0] = 0
    assert not cluster.fits(0, CPU_POD)


def test_random_places_only_where_the_pod_fits() -> None:
    nodes = [tnode("a", model="T4"), tnode("b", model="P100"), tnode("c", model="T4")]
    _, _, cluster = run(nodes, [gpu_pod(spec=("P100",))], RandomFit())
    assert cluster.gpus == [[1000], [0], [1000]]


# ---------------------------------------------------------------- FGD


def test_fgd_fragmentation_counts_what_the_typical_pods_cannot_use() -> None:
    half = fgd.Typical(cpu_milli=0, gpu_milli=500, num_gpu=1, gpu_spec=(), weight=0.5)
    two = fgd.Typical(cpu_milli=0, gpu_milli=1000, num_gpu=2, gpu_spec=(), weight=0.5)
    # GPUs free 1000 and 300: a half fits (the 300 is a fragment), two GPUs do not (all is)
    assert fgd.fgd_fragmentation([1000, 300], 0, "T4", [half, two]) == 0.5 * 300 + 0.5 * 1300
    hungry = fgd.Typical(cpu_milli=8000, gpu_milli=500, num_gpu=1, gpu_spec=(), weight=1.0)
    assert fgd.fgd_fragmentation([1000], 4000, "T4", [hungry]) == 1000


def test_fgd_puts_a_share_where_it_strands_least() -> None:
    typical = fgd.typical_shapes([gpu_pod(milli=500)] * 3 + [gpu_pod()])
    nodes = [tnode("fresh", gpus=1), tnode("half-used", gpus=1)]
    _, _, cluster = run(nodes, [gpu_pod(milli=500), gpu_pod(milli=500)], Fgd(typical))
    # the second half goes next to the first: a whole GPU stays free for a 1-GPU pod
    assert sorted(map(tuple, cluster.gpus)) == [(0,), (1000,)]


def test_typical_shapes_cover_the_popular_95_percent() -> None:
    shapes = [gpu_pod()] * 90 + [gpu_pod(milli=500)] * 6 + [gpu_pod(num=8)] * 4
    typical = fgd.typical_shapes(shapes)
    assert [(t.num_gpu, t.gpu_milli) for t in typical] == [(1, 1000), (1, 500)]
    assert sum(t.weight for t in typical) == pytest.approx(1.0)


# ---------------------------------------------------------------- Tessera


@pytest.mark.parametrize(
    "trace_node",
    [
        tnode("openb-node-0001", gpus=2, model="P100"),
        tnode("n8", gpus=8, model="G2"),
        tnode("cpu", 0),
    ],
)
def test_nodes_from_trace_rows_equal_the_converters_nodes(trace_node: TraceNode) -> None:
    config = ExtenderConfig()
    expected = node_from_json(node_object(trace_node), config.level_labels)
    built = node_state(
        trace_node.name,
        trace_node.model,
        [1000] * trace_node.gpus,
        trace_node.cpu_milli,
        trace_node.memory_mib,
    )
    assert built == expected


def test_tessera_places_by_the_extenders_choice() -> None:
    # choose_gpus gives a share the tightest GPU that holds it
    _, _, cluster = run(
        [tnode("a", gpus=2)], [gpu_pod(milli=700), gpu_pod(milli=200)], Tessera(ExtenderConfig())
    )
    assert cluster.gpus == [[100, 1000]]


def test_tessera_keeps_a_whole_node_free_for_a_big_pod() -> None:
    nodes = [tnode("a", gpus=8), tnode("b", gpus=8)]
    pods = [gpu_pod(), gpu_pod(), gpu_pod(num=8)]
    _, skipped, _ = run(nodes, pods, Tessera(ExtenderConfig()))
    assert skipped == {}


@pytest.mark.parametrize(
    ("frees", "shape"),
    [
        ([1000] * 8, gpu_pod()),
        ([1000, 1000, 300, 0, 1000, 1000, 1000, 1000], gpu_pod(milli=250)),
        ([500, 1000], gpu_pod(num=1)),
        ([1000, 1000, 1000, 1000], gpu_pod(num=4)),
        ([700, 1000], CPU_POD),
    ],
)
def test_the_harness_scores_nodes_as_the_extenders_score_node(
    frees: list[int], shape: PodAsk
) -> None:
    config = ExtenderConfig(pod_mix=mix_from_demands([demand_of(gpu_pod(milli=500))] * 3))
    harness = Cluster.of(
        [TraceNode("n", cpu_milli=20000, memory_mib=65536, gpus=len(frees), model="G2")]
    )
    harness.gpus[0] = list(frees)
    node = node_state("n", "G2", frees, 20000, 65536)
    memo = DecisionCache(config)
    ctx = PodContext(pod=PodKey("t/p"), demand=demand_of(shape), now=NOW, config=config, memo=memo)
    assert Tessera(config, integer=False).score(harness, 0, shape) == score_node(ctx, node)


def test_wire_selection_ties_every_node_the_normalized_wire_score_puts_at_10() -> None:
    # low 1, high 10: the wire's 10 is above 10 - 9/18 = 9.5; the rank decides among those
    keys = [(1.0, 3), (9.9, 5), (10.0, 2), NO_FIT, (9.4, 9)]
    assert wire_best(keys) == 1
    assert wire_best([(4.0, 1), (4.0, 2)]) == 1
    assert wire_best([NO_FIT]) == -1


def test_seeds_parse_as_ranges_and_lists() -> None:
    assert parse_seeds("42-45") == (42, 43, 44, 45)
    assert parse_seeds("1,3-4") == (1, 3, 4)
