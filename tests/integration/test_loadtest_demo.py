"""``python -m loadtest demo --short`` end to end: both servers as child processes (the
webhook over TLS with fresh certificates, the extender watching the load test's API
server), real sockets throughout, and reports whose numbers add up."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cluster import jsonio
from cluster.clock import SystemClock
from loadtest.demo import modes as demo


def test_the_short_demo_admits_places_and_reports(tmp_path: Path) -> None:
    said: list[str] = []
    # The short demo, then each verb alone for a second (the latency mode's second part).
    spec = replace(demo.demo_spec(short=True), verb_rate=40.0, verb_duration_s=1.0)
    outcome = demo.execute("demo", spec, tmp_path, clock=SystemClock(), say=said.append)

    data = jsonio.loads(outcome.json_path.read_bytes())
    assert data == jsonio.loads(jsonio.dumps(outcome.data))
    html = outcome.html_path.read_text()
    assert html.count("<svg") >= 5
    assert "Latency CDF per verb" in html
    assert "Queue wait per LocalQueue" in html

    jobs, pods = data["jobs"], data["pods"]
    # kube-apiserver: every job reviewed; the four bad ones denied with a message.
    assert len(data["denials"]) == jobs["denied"] == 4
    assert all(d["message"] and d["code"] in (403, 422) for d in data["denials"])
    assert data["latency_s"]["mutate"]["count"] == jobs["created"]
    # Kueue: every allowed job admitted or still waiting; nothing admitted twice.
    allowed = jobs["created"] - jobs["denied"]
    assert jobs["admitted"] + jobs["waiting_at_end"] == allowed
    # Each unsuspend was an UPDATE review the webhook allowed (none refused: no errors).
    assert data["latency_s"]["update"]["count"] == jobs["admitted"]
    # kube-scheduler: every pod of an admitted job is bound or pending, none lost.
    assert pods["bound"] + pods["pending_at_end"] == pods["created"]
    assert data["latency_s"]["bind"]["count"] >= pods["bound"]
    assert data["latency_s"]["schedule"]["count"] == pods["bound"]
    # No GPU given twice, no unhealthy GPU used, no quota overrun, no transport errors.
    assert data["checks"]["ok"], data["checks"]
    assert data["errors"] == {}
    assert outcome.ok
    # Pods left and their GPUs were reused: more GPU-time was bound than the fleet holds
    # at once, which only works if the extender learned that pods ended.
    assert jobs["finished"] > 0
    assert data["gpu_utilisation"]["peak_gpus"] <= data["fleet"]["gpus"]
    assert pods["gpus_bound_total"] > data["fleet"]["gpus"]
    # Each verb alone, open loop: every request answered, none refused.
    per_verb = data["open_loop_per_verb"]
    assert set(per_verb) == {"mutate", "filter", "prioritize"}
    assert all(r["sent"] == r["ok"] == 40 and not r["errors"] for r in per_verb.values())
    # Both servers were measured.
    assert set(data["rss"]) == {"webhook", "extender"}
    assert any(line.startswith("checks: all passed") for line in said)
