"""``tessera capacity --prometheus URL --range 7d`` against a fake Prometheus over real
HTTP: the report a platform team reads on Monday, from Kueue's and Tessera's metrics."""

from __future__ import annotations

import pytest

from cluster import jsonio
from cluster.clock import ManualClock
from console.__main__ import build_parser, run
from console.output import ConsoleError, Output
from tests.console_cluster import NOW
from tests.fakeprom import FakePrometheus, constant, together

GPU = {"cohort": "research"}


def week() -> FakePrometheus:
    """team-nlp waits (p90 in the 2 h-4 h bucket) while borrowing 8 of research's 32 GPUs
    (its 16 nominal, 24 used); research uses 16 of its 32; allocation is half busy."""
    waits = together(
        *(
            constant({"cluster_queue": "team-nlp", "le": le}, count)
            for le, count in (("3600", 0.0), ("7200", 0.02), ("14400", 0.2), ("+Inf", 0.2))
        ),
        *(
            constant({"cluster_queue": "research", "le": le}, count)
            for le, count in (("3600", 0.5), ("7200", 0.5), ("14400", 0.5), ("+Inf", 0.5))
        ),
    )
    return FakePrometheus(
        {
            "kueue_admission_wait_time_seconds_bucket": waits,
            "kueue_cluster_queue_resource_usage": together(
                constant({**GPU, "cluster_queue": "team-nlp", "flavor": "h100"}, 24),
                constant({**GPU, "cluster_queue": "research", "flavor": "h100"}, 16),
            ),
            "kueue_cluster_queue_nominal_quota": together(
                constant({**GPU, "cluster_queue": "team-nlp", "flavor": "h100"}, 16),
                constant({**GPU, "cluster_queue": "research", "flavor": "h100"}, 32),
            ),
            "kueue_pending_workloads": constant({"cluster_queue": "team-nlp"}, 3),
            "tessera:gpus_allocated:sum": constant({}, 40),
            "tessera:gpus_busy:sum": constant({}, 16),
            "tessera:gpus_fragmented:ratio": constant({"product": "NVIDIA-H100-80GB-HBM3"}, 0.4),
        }
    )


async def capacity(url: str, *args: str) -> Output:
    parsed = build_parser({}).parse_args(["capacity", "--prometheus", url, *args])
    return await run(parsed, {}, ManualClock(NOW))


async def test_a_week_from_prometheus_names_who_waited_while_borrowing() -> None:
    async with week() as prom:
        shown = jsonio.loads((await capacity(prom.url, "--range", "7d", "-o", "json")).text)
        text = (await capacity(prom.url)).text
    by_name = {q["cluster_queue"]: q for q in shown["queues"]}
    assert by_name["team-nlp"]["borrowed_gpus_mean"] == 8
    assert by_name["research"]["lent_gpus_mean"] == 8
    assert 7200 < by_name["team-nlp"]["wait_p90_seconds"] < 14400
    assert by_name["team-nlp"]["pending_mean"] == 3
    assert shown["allocation"] == {"allocated_gpus_mean": 40, "busy_over_allocated": 0.4}
    assert shown["fragmentation"] == {"NVIDIA-H100-80GB-HBM3": 0.4}
    assert shown["recommendations"][0].startswith("team-nlp waited p90 ")
    assert shown["recommendations"][0].endswith(
        "while borrowing 25 % of research's nominal: raise team-nlp's nominal by 8 GPUs of "
        "h100 or lower research's lending limit"
    )
    assert shown["range"]["step_seconds"] == 3600
    assert shown["range"]["end"] - shown["range"]["start"] == 7 * 86400
    assert "CLUSTERQUEUE" in text
    assert "* team-nlp waited p90" in text
    queries = [a["query"] for a in prom.asked]
    assert any("increase(kueue_admission_wait_time_seconds_bucket[3600s])" in q for q in queries)
    assert {a["step"] for a in prom.asked} == {"3600"}


async def test_a_prometheus_that_refuses_is_one_line_naming_it() -> None:
    async with FakePrometheus({}) as prom:
        with pytest.raises(ConsoleError, match=r"Prometheus at .* refused .*HTTP 400: unknown"):
            await capacity(prom.url)


@pytest.mark.parametrize("bad", ["7", "week", "-1d", "0h"])
async def test_a_range_it_cannot_read_is_refused(bad: str) -> None:
    with pytest.raises(ConsoleError, match="--range"):
        await capacity("http://127.0.0.1:9", f"--range={bad}")
