"""``tessera capacity --from-run`` on the JSON of a real short load-test run (both servers
as processes, the simulated Kueue and scheduler): the range report's shape, its figures
agreeing with the run's own, and the HTML page with its plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from cluster.clock import ManualClock, SystemClock
from console.__main__ import build_parser, run
from console.output import ConsoleError, Output
from loadtest.demo import modes as demo
from tests.console_cluster import NOW
from tests.unit.test_console_capacity_run import well_formed


@pytest.fixture(scope="module")
def run_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The short demo's JSON, as ``python -m loadtest demo --short`` writes it."""
    out = tmp_path_factory.mktemp("run")
    outcome = demo.execute("demo", demo.demo_spec(short=True), out, clock=SystemClock(), say=print)
    return outcome.json_path


@pytest.fixture(scope="module")
def ran(run_json: Path) -> dict[str, Any]:
    data = jsonio.loads(run_json.read_bytes())
    assert isinstance(data, dict)
    return data


async def capacity(*args: str) -> Output:
    parsed = build_parser({}).parse_args(["capacity", *args])
    return await run(parsed, {}, ManualClock(NOW))


async def test_a_run_reports_as_prometheus_does_with_the_runs_own_figures(
    run_json: Path, ran: dict[str, Any], tmp_path: Path
) -> None:
    page = tmp_path / "capacity.html"
    shown = await capacity("--from-run", str(run_json), "-o", "json", "--html", str(page))
    report = jsonio.loads(shown.text)
    text = (await capacity("--from-run", str(run_json))).text

    assert set(report) == {"range", "queues", "allocation", "fragmentation", "recommendations"}
    queues = {q["cluster_queue"]: q for q in report["queues"]}
    assert set(queues) == {q["name"] for q in ran["capacity"]["cluster_queues"]}
    assert sum(q["admitted"] for q in queues.values()) == ran["jobs"]["admitted"]
    for q in ran["capacity"]["cluster_queues"]:
        assert queues[q["name"]]["nominal_gpus"] == sum(q["nominal_gpus"].values())
        assert queues[q["name"]]["cohort"] == q["cohort"]
    # the same run's peak, seen through the report's steps, is never above it
    assert 0 < report["allocation"]["allocated_gpus_mean"] <= ran["gpu_utilisation"]["peak_gpus"]
    assert report["allocation"]["busy_over_allocated"] is None  # no DCGM in a load test
    assert report["range"]["end"] >= ran["duration_s"] - report["range"]["step_seconds"]
    assert text.startswith(f"over the run in {run_json.name} (")
    assert "CLUSTERQUEUE" in text
    assert "no utilisation series" in text

    assert shown.notes == (f"report: {page}",)
    parsed = well_formed(page.read_text(encoding="utf-8"))
    assert parsed.svgs == 3
    said = "".join(parsed.texts)
    assert all(r in said for r in report["recommendations"])
    if not report["recommendations"]:
        assert "no queue waited long" in said
    assert all(name in said for name in queues)


async def test_what_it_cannot_report_on_is_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_bytes(jsonio.dumps({"jobs": {"created": 3}}))  # a run from before "capacity"
    with pytest.raises(ConsoleError, match='no "capacity" section'):
        await capacity("--from-run", str(old))
    with pytest.raises(ConsoleError, match=r"--from-run .*missing\.json: No such file"):
        await capacity("--from-run", str(tmp_path / "missing.json"))
    with pytest.raises(ConsoleError, match="not both"):
        await capacity("--from-run", str(old), "--prometheus", "http://127.0.0.1:9")
    with pytest.raises(ConsoleError, match="--html is for a report over a range"):
        await capacity("--cluster-file", str(old), "--html", str(tmp_path / "x.html"))
