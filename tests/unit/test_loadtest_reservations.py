"""The reservation study (``loadtest.reservations``): on a cluster small enough to follow
by hand, a gang that starves without reservations starts once its rack frees with
them, and a short job backfilled meanwhile does not delay it; the command's JSON shape
on a synthetic trace; and one short run on the real openb trace when it is there."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import pytest

from cluster import jsonio
from loadtest.inputs.asks import PodAsk
from loadtest.inputs.traces import (
    DEFAULT_DATA_DIR,
    TraceMissing,
    TraceNode,
    read_openb_nodes,
    read_openb_pods,
)
from loadtest.reservations import study
from loadtest.reservations.cluster import SimCluster
from loadtest.reservations.engine import RunResult, play, simulate
from loadtest.reservations.workload import (
    GANG_MEMBER,
    Job,
    Warm,
    WorkloadSpec,
    racks_of,
    trace_jobs,
)

HALF = PodAsk(cpu_milli=8000, memory_mib=16384, num_gpu=4, gpu_milli=1000)
WHOLE = PodAsk(cpu_milli=8000, memory_mib=16384, num_gpu=8, gpu_milli=1000)
GANG = 1000
SHORT = 2000


def hgx(name: str) -> TraceNode:
    return TraceNode(name=name, cpu_milli=96_000, memory_mib=393_216, gpus=8, model="G2")


def small_cluster() -> SimCluster:
    """Rack r of n0 and n1, where the gang must go; x alone in rack s, for the rest."""
    return SimCluster([hgx("n0"), hgx("n1"), hgx("x")], ["r", "r", "s"])


def job(
    number: int, at: float, ask: PodAsk, duration: float, limit: int, *, members: int = 1
) -> Job:
    return Job(number, at, ask, members, duration, limit)


def scenario(policy: str, *, short_job: bool) -> RunResult:
    """At 0, n0 holds a pod until 100 s (limit 150 s) and n1 one until 300 s (limit
    450 s): the gang of two whole nodes that arrives at 10 s can have rack r at 300 s.
    From 50 s to 3,000 s a half-node pod arrives every 50 s and runs 400 s (limit
    600 s); with ``short_job``, a half-node pod of 60 s (limit 90 s) comes at 120 s,
    when x is full."""
    warm = [
        Warm(job(-1, 0, WHOLE, 100, 150), 0.0),
        Warm(job(-2, 0, WHOLE, 300, 450), 0.0),
    ]
    arrivals = [job(GANG, 10, GANG_MEMBER, 500, 1000, members=2)]
    arrivals += [job(i, 50.0 * i, HALF, 400, 600) for i in range(1, 61)]
    if short_job:
        arrivals.append(job(SHORT, 120, HALF, 60, 90))
    arrivals.sort(key=lambda j: j.arrival)
    return play(small_cluster(), policy, warm, arrivals, window_s=4000.0, stop_s=20_000.0)


def wait_of(result: RunResult, members: int) -> float:
    (found,) = [w.wait_s for w in result.waits if w.members == members]
    return found


def test_a_gang_starving_without_reservations_starts_when_its_rack_frees_with_them() -> None:
    none = scenario("none", short_job=False)
    tessera = scenario("tessera", short_job=False)
    # none: half-node pods keep landing on whichever node of r frees first; the gang
    # waits until the stream is over and both nodes drain
    assert wait_of(none, 2) > 3000
    # tessera: r is reserved from 450 s (the limit of n1's pod); nothing that ends
    # later lands there, and the gang starts when n1's pod really ends
    assert wait_of(tessera, 2) == pytest.approx(300 - 10)
    assert tessera.idle_held_gpu_hours > 0
    assert none.idle_held_gpu_hours == 0


def test_a_short_job_backfills_the_reserved_rack_and_does_not_delay_the_gang() -> None:
    without = scenario("tessera", short_job=False)
    backfilled = scenario("tessera", short_job=True)
    short = [w for w in backfilled.waits if w.members == 1 and w.gpus == 4]
    assert min(w.wait_s for w in short) == 0.0
    assert wait_of(backfilled, 2) == wait_of(without, 2)


def test_easy_reserves_for_its_queue_head_too() -> None:
    assert wait_of(scenario("easy", short_job=False), 2) == pytest.approx(300 - 10)


def test_every_policy_sees_the_same_arrivals_and_warm_start() -> None:
    results = [scenario(p, short_job=True) for p in ("none", "tessera", "easy")]
    assert len({len(r.waits) for r in results}) == 1
    assert len({r.warm_allocation_pct for r in results}) == 1


# ---------------------------------------------------------------- the command


def write_trace(folder: Path, nodes: int = 24, pods: Sequence[tuple[int, int, int]] = ()) -> Path:
    """A synthetic openb folder: ``nodes`` 8-GPU nodes and GPU pods of (GPUs, milli,
    seconds lived)."""
    base = folder / "alibaba-gpu-v2023"
    base.mkdir(parents=True)
    with (base / "openb_node_list_gpu_node.csv").open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        out.writerows([f"node-{i:03d}", 96000, 393216, 8, "G2"] for i in range(nodes))
    rows = pods or [(1, 1000, 600), (1, 500, 1200), (2, 1000, 3000), (8, 1000, 900), (1, 1000, 60)]
    with (base / "openb_pod_list_default.csv").open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
             "pod_phase", "creation_time", "deletion_time", "scheduled_time"]
        )  # fmt: skip
        for i, (gpus, milli, lived) in enumerate(rows):
            out.writerow([f"pod-{i}", 4000, 8192, gpus, milli, "", "LS", "Running", 0, lived, 0])
    return folder


def test_the_command_writes_each_policys_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_trace(tmp_path / "data")
    out = tmp_path / "resv.json"
    code = study.main(
        ["--data", str(data), "--seeds", "1-2", "--hours", "0.5", "--max-hours", "1",
         "--processes", "1", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    found = jsonio.loads(out.read_bytes())
    assert list(found) == ["policies"]
    assert list(found["policies"]) == ["none", "tessera", "easy"]
    for figures in found["policies"].values():
        for key in ("gang16_p99_wait_s", "mean_wait_s", "mean_allocation_pct"):
            assert isinstance(figures[key], int | float)
        assert figures["config"]["seeds"] == [1, 2]
        assert len(figures["per_seed"]) == 2
    table = capsys.readouterr().out
    assert "gang16 p99" in table
    assert "tessera" in table


def test_a_trace_without_times_is_refused_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_trace(tmp_path / "data")
    pods = data / "alibaba-gpu-v2023" / "openb_pod_list_multigpu20.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod-0,4000,8192,8,1000\n")
    assert study.main(["--data", str(data), "--trace", "multigpu20"]) == 2
    assert "no durations" in capsys.readouterr().err


def test_missing_data_says_where_the_traces_are_read_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert study.main(["--data", str(tmp_path)]) == 2
    assert "TESSERA_DATA" in capsys.readouterr().err


# ---------------------------------------------------------------- the real trace


def test_the_openb_trace_plays_and_tessera_reserves_on_it() -> None:
    try:
        nodes = read_openb_nodes(DEFAULT_DATA_DIR)
    except TraceMissing as exc:
        pytest.skip(f"the openb traces are not here: {exc}")
    racks = racks_of(nodes)
    assert all(racks.count(r) <= 8 for r in set(racks))
    spec = WorkloadSpec(hours=0.25, max_hours=2, tail_hours=1)
    pool = trace_jobs(read_openb_pods(DEFAULT_DATA_DIR), spec.max_hours)
    result = simulate(nodes, pool, spec, 42, "tessera")
    assert result.waits
    assert 80 < result.mean_allocation_pct <= 100
