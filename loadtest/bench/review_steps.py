"""One step of a webhook benchmark: AdmissionReviews sent open loop over keep-alive TLS
from a load generator process of its own, what the server's ``/proc`` says it cost, the
server it went to (``Server``), and the step as a row of a table (``step_line``).

Layer: I/O (starts a process, opens sockets, reads ``/proc``). Shared by the benchmarks
that send captured reviews (``webhook``, ``overload``, ``against_kueue``); the open
loop itself is ``loadtest.measure.openloop``. Must not decide anything about what a server
answers beyond whether the benchmark accepts it (``check_answer``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import uvloop

from cluster import jsonio
from cluster.clock import Clock, SystemClock
from loadtest.measure.openloop import (
    Http1Connection,
    RequestFailed,
    RunResult,
    Schedule,
    Send,
    run_open_loop,
)
from loadtest.measure.pinned import (
    SERVER_NAME,
    BenchError,
    Pinned,
    proc_cpu_s,
    proc_memory,
    set_priority,
)
from loadtest.measure.stats import Summary
from server.tls import client_context

MUTATE_PATH: Final = "/mutate?timeout=5s"
HEADERS: Final = {
    "User-Agent": "kube-apiserver-admission",
    "Accept": "application/json, */*",
    "Content-Type": "application/json",
}
"""What kube-apiserver sent in the capture (less Host and Content-Length)."""


# ---------------------------------------------------------------- the request


VARIANT_ANNOTATION: Final = "bench.tessera.dev/template"
"""Set on the captured Job to its template number when more than one template is sent."""


@dataclass(frozen=True, slots=True)
class ReviewTemplate:
    """The captured review as bytes around its uid (and, with ``templates`` above 1, a
    template number annotated on the Job; with ``renamed``, a name of its own per
    request), so a fresh review costs no re-encoding."""

    parts: tuple[bytes, ...]
    slots: tuple[str, ...]
    """What goes between ``parts``, in order: ``uid``, ``template`` or ``name``."""
    templates: int = 1

    @classmethod
    def of(
        cls, review_body: dict[str, Any], templates: int = 1, *, renamed: bool = False
    ) -> ReviewTemplate:
        """``renamed``: the Job is named ``<its generateName><request index in hex>``
        instead of being left to kube-apiserver's name generator, as a pipeline that
        names its Jobs sends them: objects that differ only in name."""
        token = uuid.uuid4().hex
        markers = {
            "uid": f"@@uid-{token}@@",
            "template": f"@@template-{token}@@",
            "name": f"@@name-{token}@@",
        }
        request = {**review_body["request"], "uid": markers["uid"]}
        obj = request["object"]
        metadata = dict(obj.get("metadata") or {})
        if templates > 1:
            annotations = {**(metadata.get("annotations") or {})}
            annotations[VARIANT_ANNOTATION] = markers["template"]
            metadata["annotations"] = annotations
        if renamed:
            stem = metadata.pop("generateName", None) or f"{metadata.get('name') or 'job'}-"
            metadata["name"] = stem + markers["name"]
        request["object"] = {**obj, "metadata": metadata}
        raw = jsonio.dumps({**review_body, "request": request})
        by_marker = {marker.encode(): slot for slot, marker in markers.items()}
        pieces = re.split(b"(" + b"|".join(map(re.escape, by_marker)) + b")", raw)
        parts, slots = tuple(pieces[0::2]), tuple(by_marker[m] for m in pieces[1::2])
        wanted = ["uid", *(["template"] if templates > 1 else []), *(["name"] if renamed else [])]
        if sorted(slots) != sorted(wanted):
            raise BenchError("the review's uid could not be templated")
        return cls(parts, slots, max(1, templates))

    def body(self, uid: str, index: int = 0) -> bytes:
        """The review with ``uid``; its Job is template ``index`` modulo ``templates``
        (and, when renamed, named after ``index``)."""
        values = {
            "uid": uid.encode(),
            "template": str(index % self.templates).encode(),
            "name": b"%x" % index,
        }
        out = [self.parts[0]]
        for slot, part in zip(self.slots, self.parts[1:], strict=True):
            out += (values[slot], part)
        return b"".join(out)


def uid_prefix() -> str:
    """The first 24 characters of a random UUID: with 12 hex digits of the request index
    after them, every request of a step has a fresh, UUID-shaped uid."""
    return str(uuid.uuid4())[:24]


def check_answer(status: int, body: bytes, uid: str, *, patch: bool = True) -> dict[str, Any]:
    """The AdmissionReview response, if it admits the review with a patch (``patch``) or
    without one (not ``patch``); else raises ``RequestFailed`` with the kind of failure
    (what the results count)."""
    if status != 200:
        raise RequestFailed(f"http-{status}", body[:200].decode(errors="replace"))
    try:
        answer = jsonio.loads(body)
    except jsonio.JsonError:
        raise RequestFailed("not-json") from None
    response = answer.get("response") if isinstance(answer, dict) else None
    if not isinstance(response, dict) or response.get("uid") != uid:
        raise RequestFailed("wrong-uid")
    if response.get("allowed") is not True:
        raise RequestFailed("denied", str(response.get("status")))
    if patch and not response.get("patch"):
        raise RequestFailed("no-patch")
    if not patch and response.get("patch"):
        raise RequestFailed("unexpected-patch")
    return response


# ---------------------------------------------------------------- /proc


def own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


# ---------------------------------------------------------------- one step, in its own process


@dataclass(frozen=True, slots=True)
class StepSpec:
    server: str
    mode: str
    """``warm-up``, ``fixed`` or ``search``."""
    port: int
    server_pid: int
    ca: str
    template: ReviewTemplate
    rate: float
    duration_s: float
    connections: int
    core: int
    nice: int
    timeout_s: float
    max_lag_s: float
    max_requests: int
    path: str = MUTATE_PATH
    server_name: str = SERVER_NAME
    """The name the client verifies the server's certificate against."""
    patch: bool = True
    """Whether an accepted answer carries a patch (``check_answer``)."""
    first_index: int = 0
    """Request ``i`` sends template ``first_index + i``: steps that must not repeat each
    other's bodies take disjoint ranges."""


@dataclass(frozen=True, slots=True)
class StepResult:
    spec: StepSpec
    run: RunResult
    server_cpu: float
    """Share of one CPU the server used during the run."""
    generator_cpu: float
    server_memory: dict[str, int]
    """VmRSS and VmHWM after the run, bytes."""
    passed: bool = False
    verdict: str = ""

    @property
    def latency(self) -> Summary:
        return self.run.latency.summary()

    @property
    def cpu_per_review(self) -> float:
        """Server CPU seconds per request it answered: what one review costs it."""
        return self.server_cpu * self.run.elapsed_s / max(1, self.run.sent)

    def to_json(self) -> dict[str, Any]:
        run = self.run
        return {
            "server": self.spec.server,
            "mode": self.spec.mode,
            "offered_rate": self.spec.rate,
            "duration_s": self.spec.duration_s,
            "connections": self.spec.connections,
            "scheduled": run.schedule.count,
            "sent": run.sent,
            "ok": run.ok,
            "errors": dict(run.errors),
            "achieved_rate": run.achieved_rate,
            "elapsed_s": run.elapsed_s,
            "stopped": run.stopped,
            "latency": run.latency.summary().to_json(),
            "service": run.service.summary().to_json(),
            "lag": run.lag.summary().to_json(),
            "late": run.late.summary().to_json(),
            "latency_histogram": run.latency.to_json(),
            "per_second": list(run.per_second),
            "server_cpu": self.server_cpu,
            "server_cpu_per_review_s": self.cpu_per_review,
            "generator_cpu": self.generator_cpu,
            "server_memory": self.server_memory,
            "passed": self.passed,
            "verdict": self.verdict,
        }


async def _generate(spec: StepSpec) -> tuple[RunResult, float, float]:
    context = client_context(spec.ca)
    connections = [
        Http1Connection(
            "127.0.0.1",
            spec.port,
            ssl_context=context,
            server_hostname=spec.server_name,
            headers=HEADERS,
        )
        for _ in range(spec.connections)
    ]
    prefix = uid_prefix()

    def sender(connection: Http1Connection) -> Send:
        async def send(index: int) -> None:
            uid = f"{prefix}{index:012x}"
            body = spec.template.body(uid, spec.first_index + index)
            answer = await connection.request("POST", spec.path, body)
            check_answer(answer.status, answer.body, uid, patch=spec.patch)

        return send

    # Handshakes and a first request on every connection before the clock starts.
    warm = uid_prefix()
    for n, connection in enumerate(connections):
        uid = f"{warm}{n:012x}"
        answer = await connection.request("POST", spec.path, spec.template.body(uid))
        check_answer(answer.status, answer.body, uid, patch=spec.patch)
    schedule = Schedule.for_duration(spec.rate, spec.duration_s, spec.max_requests)
    clock = SystemClock()
    gc.collect()
    cpu_before, own_before = proc_cpu_s(spec.server_pid), own_cpu_s()
    run = await run_open_loop(
        schedule,
        [sender(c) for c in connections],
        clock,
        timeout_s=spec.timeout_s,
        max_lag_s=spec.max_lag_s,
    )
    server_cpu = proc_cpu_s(spec.server_pid) - cpu_before
    own = own_cpu_s() - own_before
    for connection in connections:
        connection.close()
    return run, server_cpu / run.elapsed_s, own / run.elapsed_s


def _generator_process(spec: StepSpec, pipe: Connection) -> None:
    """The load generator's process: pinned to its own core, one step, results back."""
    os.sched_setaffinity(0, {spec.core})
    if spec.nice:
        os.setsid()
        set_priority(os.getpid(), spec.nice)
    gc.freeze()  # what was imported stays out of the collector's way during the run
    try:
        run, server_cpu, own = uvloop.run(_generate(spec))
        memory = proc_memory(spec.server_pid)
        pipe.send(("ok", (run, server_cpu, own, memory)))
    except Exception as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def in_generator_process(
    target: Callable[[Any, Connection], None], arg: Any, bound_s: float
) -> Any:
    """``target(arg, pipe)`` in a process of its own (the load generator: off the server's
    core and this process's GIL), and the payload it sent as ``("ok", payload)``; a
    ``BenchError`` when it failed, died, or did not finish within ``bound_s``."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=target, args=(arg, send), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(bound_s):
            raise BenchError(f"the load generator did not finish in {bound_s:.0f} s")
        status, payload = receive.recv()
    except EOFError:
        raise BenchError("the load generator died without a result") from None
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    if status != "ok":
        raise BenchError(f"the load generator failed: {payload}")
    return payload


def run_step(spec: StepSpec) -> StepResult:
    bound = spec.duration_s + spec.max_lag_s + spec.timeout_s + 60
    run, server_cpu, own, memory = in_generator_process(_generator_process, spec, bound)
    return StepResult(spec, run, server_cpu, own, memory)


async def wait_ready(
    server: Pinned, ca: Path, clock: Clock, deadline_s: float, poll_s: float = 0.2
) -> None:
    """Until the server's ``/readyz`` answers 200 over TLS; ``BenchError`` if its process
    exits first (with its log's tail) or the deadline passes."""
    connection = Http1Connection(
        "127.0.0.1", server.port, ssl_context=client_context(ca), server_hostname=SERVER_NAME
    )
    give_up = clock.monotonic() + deadline_s
    try:
        while True:
            if server.process is not None and server.process.poll() is not None:
                raise BenchError(f"{server.name} exited at start:\n{server.log_tail()}")
            try:
                if (await connection.request("GET", "/readyz")).status == 200:
                    return
            except OSError:
                connection.close()
            if clock.monotonic() > give_up:
                raise BenchError(f"{server.name} was not ready in {deadline_s:.0f} s")
            await asyncio.sleep(poll_s)
    finally:
        connection.close()


# ---------------------------------------------------------------- the server


@dataclass(slots=True)
class Server(Pinned):
    """One of the two servers, and what the benchmark learns of it besides latency."""

    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    """Named moments (``idle``, ``warm``, ``end``) → VmRSS/VmHWM."""
    first_review_s: float = 0.0
    patch_ops: int = 0

    def note_memory(self, moment: str) -> None:
        self.memory[moment] = proc_memory(self.pid)


# ---------------------------------------------------------------- a step in a table


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table (two decimals below 10 ms); ``-`` for none."""
    if seconds == math.inf:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds * 1000:.1f} ms"


STEP_HEADER: Final = (
    f"{'server':<9} {'offered/s':>9} {'achieved/s':>10} {'ok':>7} {'err':>4} {'p50':>9} "
    f"{'p90':>9} {'p99':>9} {'p99.9':>9} {'max':>9} {'lag p99':>9} {'late p99':>9} "
    f"{'srv CPU':>7} {'CPU/rev':>7}  verdict"
)


def step_line(result: StepResult) -> str:
    """One step as a row under ``STEP_HEADER``."""
    run, lat = result.run, result.latency
    return (
        f"{result.spec.server:<9} {result.spec.rate:>9,.0f} {run.achieved_rate:>10,.1f} "
        f"{run.ok:>7,} {run.error_count:>4} {ms(lat.p50):>9} {ms(lat.p90):>9} "
        f"{ms(lat.p99):>9} {ms(lat.p999):>9} {ms(lat.maximum):>9} "
        f"{ms(run.lag.summary().p99):>9} {ms(run.late.summary().p99):>9} "
        f"{result.server_cpu:>7.0%} {result.cpu_per_review * 1e6:>5.0f}us"
        f"  {result.verdict or run.stopped}"
    ).rstrip()
