"""Each verb alone at a fixed rate, open loop: what one server sustains per verb.

Layer: I/O. After the cluster run, with the servers still up, sends ``/mutate``,
``/filter`` and ``/prioritize`` at ``rate`` per second each (one verb at a time) through
``openloop.run_open_loop`` over keep-alive ``Http1Connection``s, so that latency counts
from each request's intended send time (coordinated-omission-safe). ``/bind`` is not
driven this way: a bind needs a pending pod and changes the cluster; its latency comes
from the cluster run. Must not decide anything about the answers beyond "is this a
valid answer".
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from yarl import URL

from cluster import jsonio, labels
from cluster.clock import Clock
from loadtest.inputs.fleet import TEAMS, job_object
from loadtest.measure.openloop import Http1Connection, RequestFailed, Schedule, Send, run_open_loop
from loadtest.measure.stats import Summary
from loadtest.sim import objects


@dataclass(frozen=True, slots=True)
class VerbRun:
    verb: str
    rate: float
    names: int
    """Candidate node names per ``/filter`` and ``/prioritize`` (0 for ``/mutate``)."""
    sent: int
    ok: int
    errors: dict[str, int]
    achieved_rate: float
    latency: Summary
    """From intended send time: the number to quote."""
    service: Summary
    """From actual send time: what a closed-loop tool would report."""

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "names": self.names,
            "sent": self.sent,
            "ok": self.ok,
            "errors": self.errors,
            "achieved_rate": self.achieved_rate,
            "latency_s": self.latency.to_json(),
            "service_s": self.service.to_json(),
        }


def _pod(name: str) -> dict[str, Any]:
    limits = {"cpu": "8", "memory": "64Gi", labels.GPU_RESOURCE: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-nlp", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": labels.DEFAULT_SCHEDULER_NAME,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


def _connection(url: str, context: ssl.SSLContext | None) -> Http1Connection:
    parsed = URL(url)
    host = parsed.host or "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return Http1Connection(
        host,
        port,
        ssl_context=context if parsed.scheme == "https" else None,
        server_hostname=host,
        headers={"Content-Type": "application/json"},
    )


def _check(status: int, body: bytes, verb: str) -> None:
    if status != 200:
        raise RequestFailed(f"http-{status}")
    answer = jsonio.loads(body)
    if verb == "mutate" and not (answer.get("response") or {}).get("allowed"):
        raise RequestFailed("denied")
    if verb == "filter" and answer.get("Error"):
        raise RequestFailed("extender-error", str(answer["Error"])[:80])


async def run_verbs(
    webhook_url: str,
    extender_url: str,
    node_names: Sequence[str],
    clock: Clock,
    *,
    webhook_ssl: ssl.SSLContext | None,
    extender_ssl: ssl.SSLContext | None,
    rate: float,
    duration_s: float,
    connections: int = 8,
) -> list[VerbRun]:
    job = job_object("rate", TEAMS[0])
    pod = _pod("rate-probe")
    args = jsonio.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(node_names)})
    base = {"mutate": webhook_url, "filter": extender_url, "prioritize": extender_url}
    runs: list[VerbRun] = []
    for verb in ("mutate", "filter", "prioritize"):
        url = base[verb]
        context = webhook_ssl if verb == "mutate" else extender_ssl
        path = URL(url).path.rstrip("/") + (
            "/mutate?timeout=10s" if verb == "mutate" else f"/{verb}"
        )
        pool = [_connection(url, context) for _ in range(connections)]

        def sender(conn: Http1Connection, verb: str = verb, path: str = path) -> Send:
            async def send(index: int) -> None:
                if verb == "mutate":
                    uid = f"rate-{index:08d}"
                    body = jsonio.dumps(objects.admission_review(job, uid))
                else:
                    body = args
                answer = await conn.request("POST", path, body)
                _check(answer.status, answer.body, verb)

            return send

        try:
            result = await run_open_loop(
                Schedule.for_duration(rate, duration_s), [sender(c) for c in pool], clock
            )
        finally:
            for conn in pool:
                conn.close()
        runs.append(
            VerbRun(
                verb,
                rate,
                0 if verb == "mutate" else len(node_names),
                result.sent,
                result.ok,
                dict(result.errors),
                result.achieved_rate,
                result.latency.summary(),
                result.service.summary(),
            )
        )
    return runs
