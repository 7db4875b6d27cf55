"""Benchmark of the admission webhook: one core, TLS, keep-alive, open loop (a measurement,
not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts processes, prints a
table). Must not be imported by the servers or run by pytest.

``python -m loadtest.bench.webhook [--rate 2000 --duration 10 --queues 1000 --json F]``:

1. writes a queue policy with ``--queues`` LocalQueues (namespaces of teams, ClusterQueues
   in cohorts, H100/H200/A100/L40S flavors reserved and spot, a Topology, priority
   classes and the ``tessera.dev/*`` annotations), in which the captured Job's queue
   ``team-nlp/team-nlp-queue`` exists;
2. makes fresh certificates with ``python -m certs`` in a temporary folder;
3. starts ``python -m webhook`` and ``python -m loadtest.bench.baseline_webhook`` (decode and a
   fixed patch, nothing else) on 127.0.0.1, each pinned to the server core, and waits
   for ``/readyz``;
4. from a separate process pinned to the other core, sends the captured Job's
   AdmissionReview (``../shared/captures/000-webhook-mutate-request.json``, a fresh uid
   per request) over a pool of keep-alive TLS connections that verify the CA, open loop
   (``loadtest.measure.openloop``): a warm-up, a fixed-rate run, then a search for the highest
   rate each server sustains (no errors, no backlog, achieved rate close to the offered
   one, p99 under a bound that catches a queue building up);
5. runs the targets of issue 4 once more scaled to this machine (``--scaled``): they were
   set where the baseline served 10,000 reviews/s, so both rates are multiplied by the
   baseline's capacity here (one core over its CPU per review) divided by 10,000;
6. prints a table (latency percentiles from intended send times, throughput, server CPU
   and RSS from ``/proc``, webhook/baseline ratios, the targets of issue 4 as written and
   scaled) and, with ``--json``, writes the same as JSON.

Everything is bounded: requests per step, seconds per step, steps per search, a search
time budget and a request timeout; the default run takes two to three minutes.

On a shared machine the neighbours' processes take turns on the pinned cores, and their
time slices show up as milliseconds of tail latency for both servers. The figures to
quote are therefore the ratios to the baseline measured in the same run, and the server
CPU per review (from ``/proc``), which queueing does not distort. ``--nice -10`` (root)
gives the servers and the generator sessions of their own at a higher priority, which
keeps most of the neighbours off the pinned cores for the few minutes of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import io
import math
import os
import pstats
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import uvloop
import yaml

from cluster import jsonio
from cluster import labels as keys
from cluster.clock import Clock, SystemClock
from cluster.files import load_objects
from loadtest.bench.review_steps import (
    HEADERS,
    MUTATE_PATH,
    ReviewTemplate,
    StepResult,
    StepSpec,
    check_answer,
    run_step,
    uid_prefix,
)
from loadtest.measure.openloop import (
    Http1Connection,
    RequestFailed,
)
from loadtest.measure.pinned import (
    ROOT,
    SERVER_NAME,
    BenchError,
    Pinned,
    free_port,
    make_certs,
    proc_memory,
)
from server.tls import client_context
from webhook.admit import admit
from webhook.answers import ANSWERS_KEPT
from webhook.patch import diff
from webhook.review import decode_review, encode_response
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig, Allowed
from webhook.source import PolicyStore

DEFAULT_CAPTURES: Final = ROOT.parent / "shared" / "captures"
CAPTURED_JOB: Final = "000-webhook-mutate-request.json"
CAPTURED_NAMESPACE: Final = "team-nlp"
CAPTURED_QUEUE: Final = "team-nlp-queue"
MB: Final = 1024 * 1024

# Targets of issue 4.
TARGET_RATE: Final = 4000.0
TARGET_P99_S: Final = 0.005
TARGET_P99_AT: Final = 2000.0
TARGET_RSS: Final = 150 * MB
ISSUE_BASELINE_RATE: Final = 10_000.0
"""What the bare baseline served on one core of the machine issue 4 was written on: the
targets above are that machine's. ``--scaled`` scales them by this run's baseline."""


# ---------------------------------------------------------------- the queue policy


TOPOLOGY: Final = "gpu-topology"
BLOCK_LABEL: Final = "cloud.example.com/block"
RACK_LABEL: Final = "cloud.example.com/rack"
CAPACITY_LABEL: Final = "cloud.example.com/capacity"
SPOT_TAINT: Final = "cloud.example.com/spot"
PRIORITIES: Final = (("batch-low", 100), ("batch", 500), ("batch-high", 1000), ("prod", 10000))
# name, GPU product (as GPU Feature Discovery writes it), spot, in the Topology
GPU_FLAVORS: Final = (
    ("h100-reserved", "NVIDIA-H100-80GB-HBM3", False, True),
    ("h100-spot", "NVIDIA-H100-80GB-HBM3", True, True),
    ("h200-reserved", "NVIDIA-H200-141GB-HBM3e", False, True),
    ("a100-reserved", "NVIDIA-A100-SXM4-80GB", False, False),
    ("a100-spot", "NVIDIA-A100-SXM4-80GB", True, False),
    ("l40s", "NVIDIA-L40S", False, False),
)
QUEUES_PER_NAMESPACE: Final = 4
NAMESPACES_PER_TEAM: Final = 2
TEAMS_PER_COHORT: Final = 10
ENVIRONMENTS: Final = ("train", "research", "eval", "serve")


def _kueue(kind: str, name: str, namespace: str | None = None, **rest: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    annotations = rest.pop("annotations", None)
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": metadata, **rest}


def _flavor(name: str, product: str, spot: bool, topology: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeLabels": {keys.GFD_PRODUCT: product, CAPACITY_LABEL: "spot" if spot else "reserved"}
    }
    if spot:
        spec["nodeTaints"] = [{"key": SPOT_TAINT, "value": "true", "effect": "NoSchedule"}]
    flavor = _kueue("ResourceFlavor", name, spec=spec)
    if topology:
        flavor["metadata"]["annotations"] = {keys.FLAVOR_TOPOLOGY: TOPOLOGY}
    return flavor


def _cluster_queue(name: str, cohort: str, rng: random.Random, captured: bool) -> dict[str, Any]:
    gpu_flavors = [f[0] for f in GPU_FLAVORS]
    if captured:
        # The captured Job (2 pods x 4 GPUs, no product asked) must fit, as in the goldens.
        chosen = ["h100-reserved", "h100-spot", "a100-reserved"]
    else:
        chosen = sorted(rng.sample(gpu_flavors, rng.randint(2, 4)), key=gpu_flavors.index)
    flavors = []
    for flavor in chosen:
        quota: dict[str, Any] = {
            "name": keys.GPU_RESOURCE,
            "nominalQuota": rng.choice([8, 16, 32, 64]),
        }
        if captured and flavor == "h100-reserved":
            quota["nominalQuota"] = 32
        if rng.random() < 0.5:
            quota["borrowingLimit"] = rng.choice([0, 8, 16, 32])
        if rng.random() < 0.3:
            quota["lendingLimit"] = rng.choice([0, 8])
        resources = [quota]
        if flavor.startswith(("a100", "l40s")):
            resources.append({"name": keys.GPU_MILLI_RESOURCE, "nominalQuota": "8000"})
        flavors.append({"name": flavor, "resources": resources})
    annotations = {
        keys.DEFAULT_PRIORITY_CLASS: rng.choice(["batch-low", "batch"]),
        keys.DEFAULT_TIME_LIMIT: rng.choice(["4h", "8h", "90m"]),
        keys.MAX_TIME_LIMIT: rng.choice(["24h", "72h", "168h"]),
    }
    if rng.random() < 0.3 and not captured:
        annotations[keys.MAX_GPUS_PER_JOB] = str(rng.choice([16, 32, 64]))
    return _kueue(
        "ClusterQueue",
        name,
        annotations=annotations,
        spec={
            "cohortName": cohort,
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "cpu",
                            "resources": [
                                {"name": "cpu", "nominalQuota": str(rng.choice([256, 512]))},
                                {"name": "memory", "nominalQuota": rng.choice(["2Ti", "4Ti"])},
                            ],
                        }
                    ],
                },
                {
                    "coveredResources": [keys.GPU_RESOURCE, keys.GPU_MILLI_RESOURCE],
                    "flavors": flavors,
                },
            ],
        },
    )


def _local_queue(namespace: str, name: str, cluster_queue: str, env: str) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if env == "serve":
        annotations[keys.DEFAULT_PRIORITY_CLASS] = "prod"
    elif env == "eval":
        annotations[keys.DEFAULT_TIME_LIMIT] = "1h"
    return _kueue(
        "LocalQueue",
        name,
        namespace,
        annotations=annotations,
        spec={"clusterQueue": cluster_queue},
    )


def policy_objects(local_queues: int, seed: int = 1) -> list[dict[str, Any]]:
    """Kueue objects with exactly ``local_queues`` LocalQueues (at least 1), deterministic.

    Teams own a ClusterQueue each (ten teams to a cohort) and two namespaces with four
    LocalQueues each (``default``, ``<ns>-queue``, ``<ns>-<env>`` and ``<ns>-urgent``).
    Team 0 is the captured Job's: namespace ``team-nlp``, queue ``team-nlp-queue``.
    """
    if local_queues < 1:
        raise ValueError("the policy needs at least the captured Job's LocalQueue")
    rng = random.Random(seed)
    objects: list[dict[str, Any]] = [
        _kueue(
            "Topology",
            TOPOLOGY,
            spec={"levels": [{"nodeLabel": x} for x in (BLOCK_LABEL, RACK_LABEL, keys.HOSTNAME)]},
        ),
        _kueue("ResourceFlavor", "cpu"),
        *(_flavor(*f) for f in GPU_FLAVORS),
        *(
            _kueue("WorkloadPriorityClass", name, value=value, description=f"{name} work")
            for name, value in PRIORITIES
        ),
    ]
    per_team = QUEUES_PER_NAMESPACE * NAMESPACES_PER_TEAM
    teams = math.ceil(local_queues / per_team)
    queues: list[dict[str, Any]] = []
    for team in range(teams):
        captured = team == 0
        cq = "team-nlp" if captured else f"team-{team:04d}"
        cohort = f"org-{team // TEAMS_PER_COHORT:03d}"
        objects.append(_cluster_queue(cq, cohort, rng, captured))
        for n in range(NAMESPACES_PER_TEAM):
            env = ENVIRONMENTS[(team + n) % len(ENVIRONMENTS)]
            namespace = CAPTURED_NAMESPACE if captured and n == 0 else f"{cq}-{env}"
            names = (
                CAPTURED_QUEUE if namespace == CAPTURED_NAMESPACE else f"{namespace}-queue",
                "default",
                f"{namespace}-{env}",
                f"{namespace}-urgent",
            )
            for name in names:
                queue = _local_queue(namespace, name, cq, env)
                if name.endswith("-urgent"):
                    queue["metadata"]["annotations"] = {
                        keys.DEFAULT_PRIORITY_CLASS: "batch-high",
                        keys.MAX_TIME_LIMIT: "12h",
                    }
                queues.append(queue)
    return objects + queues[:local_queues]


def write_policy(path: Path, objects: Sequence[dict[str, Any]]) -> None:
    dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    header = f"# Generated by loadtest.bench.webhook: {len(objects)} Kueue objects.\n"
    path.write_text(header + yaml.dump_all(objects, Dumper=dumper, sort_keys=False))


# ---------------------------------------------------------------- the request


def load_captured_review(captures: Path) -> dict[str, Any]:
    path = captures / CAPTURED_JOB
    if not path.is_file():
        raise BenchError(
            f"captures not found at {captures} (the shared folder beside the repo); "
            "give --captures DIR"
        )
    review_body: dict[str, Any] = jsonio.loads(path.read_bytes())["body"]
    request = review_body["request"]
    if (request.get("namespace"), request["object"]["metadata"]["labels"].get(keys.QUEUE_NAME)) != (
        CAPTURED_NAMESPACE,
        CAPTURED_QUEUE,
    ):
        raise BenchError(f"{path} is not the team-nlp/team-nlp-queue Job this benchmark expects")
    return review_body


# ---------------------------------------------------------------- servers


@dataclass(slots=True)
class Server(Pinned):
    """One of the two servers, and what the benchmark learns of it besides latency."""

    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    """Named moments (``idle``, ``warm``, ``end``) → VmRSS/VmHWM."""
    first_review_s: float = 0.0
    patch_ops: int = 0

    def note_memory(self, moment: str) -> None:
        self.memory[moment] = proc_memory(self.pid)


async def _probe(
    server: Server, ca: Path, template: ReviewTemplate, clock: Clock, deadline_s: float
) -> None:
    """Wait for ``/readyz``, then send one review and time it: the first review may pay
    for building the policy."""
    context = client_context(ca)
    connection = Http1Connection(
        "127.0.0.1", server.port, ssl_context=context, server_hostname=SERVER_NAME, headers=HEADERS
    )
    give_up = clock.monotonic() + deadline_s
    while True:
        if server.process is not None and server.process.poll() is not None:
            raise BenchError(f"{server.name} exited at start:\n{server.log_tail()}")
        try:
            ready = await connection.request("GET", "/readyz")
            if ready.status == 200:
                break
        except OSError:
            connection.close()
        if clock.monotonic() > give_up:
            raise BenchError(f"{server.name} was not ready in {deadline_s:.0f} s")
        await asyncio.sleep(0.1)
    server.note_memory("idle")
    uid = uid_prefix() + "0" * 12
    start = clock.monotonic()
    answer = await connection.request("POST", MUTATE_PATH, template.body(uid))
    server.first_review_s = clock.monotonic() - start
    try:
        response = check_answer(answer.status, answer.body, uid)
    except RequestFailed as exc:
        raise BenchError(f"{server.name} did not admit the captured Job: {exc}") from None
    finally:
        connection.close()
    patch = jsonio.loads(base64.b64decode(response["patch"]))
    server.patch_ops = len(patch)
    server.note_memory("first-review")


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Criteria:
    """What a search step must show to count as sustained."""

    p99_bound_s: float
    min_achieved: float

    def judge(self, result: StepResult) -> StepResult:
        run = result.run
        problems = []
        if run.stopped:
            problems.append("fell behind")
        if run.error_count:
            problems.append(f"{run.error_count} errors")
        p99 = run.latency.percentile(99.0) if run.ok else math.inf
        if p99 > self.p99_bound_s:
            problems.append(f"p99 {_ms(p99)} > {_ms(self.p99_bound_s)}")
        if run.achieved_rate < self.min_achieved * result.spec.rate:
            problems.append(f"achieved {run.achieved_rate / result.spec.rate:.0%} of offered")
        notes = []
        if problems and result.server_cpu < 0.85:
            notes.append("server CPU < 85 %: not server-bound?")
        if run.ok and run.late.percentile(99) > 0.001:
            notes.append("generator late")
        verdict = "; ".join(problems + notes) if problems else "; ".join(["sustained", *notes])
        return StepResult(
            result.spec,
            result.run,
            result.server_cpu,
            result.generator_cpu,
            result.server_memory,
            passed=not problems,
            verdict=verdict,
        )


@dataclass(frozen=True, slots=True)
class SearchPlan:
    start: float
    factor: float
    refine: int
    max_steps: int
    duration_s: float
    retry: bool = True
    """Run a failed step once more before believing it: on a shared machine one bad step
    may be a neighbour's burst rather than the server's limit."""


def search(
    plan: SearchPlan,
    criteria: Criteria,
    step: Callable[[float], StepResult],
    out_of_time: Callable[[], bool],
) -> list[StepResult]:
    """Multiply the rate by ``factor`` until a step fails, then bisect ``refine`` times
    between the last rate sustained and the first one not (a failed step is run twice
    with ``retry``; either passing counts). Bounded by ``max_steps`` and ``out_of_time``."""
    results: list[StepResult] = []
    good, bad = 0.0, math.inf
    rate = plan.start
    bisections = 0
    while len(results) < plan.max_steps and not out_of_time():
        result = criteria.judge(step(rate))
        results.append(result)
        if not result.passed and plan.retry and len(results) < plan.max_steps:
            result = criteria.judge(step(rate))
            results.append(result)
        if result.passed:
            good = max(good, rate)
        else:
            bad = min(bad, rate)
        if bad == math.inf:
            rate = _round_rate(rate * plan.factor)
            continue
        if good == 0.0:
            rate = _round_rate(rate / plan.factor)  # started too high: come down first
            continue
        middle = _round_rate((good + bad) / 2)
        if bisections >= plan.refine or middle in (good, bad):
            break
        rate, bisections = middle, bisections + 1
    return results


def _round_rate(rate: float) -> float:
    step = 50.0 if rate >= 1000 else 10.0
    return max(step, round(rate / step) * step)


def max_sustained(results: Sequence[StepResult]) -> StepResult | None:
    passed = [r for r in results if r.passed]
    return max(passed, key=lambda r: r.spec.rate) if passed else None


# ---------------------------------------------------------------- in-process cost


@dataclass(frozen=True, slots=True)
class InProcess:
    """Seconds per call, measured in this process on the captured review."""

    reviews: int
    review_s: float
    """With the answers the policy keeps: the captured Job again and again, renamed."""
    first_s: float
    """With no answer kept: every review runs the rules, as the first of a template does."""
    stages: tuple[tuple[str, float], ...]
    """``review()``'s parts: decode, decide, diff, encode."""
    policy_build_s: float
    after_change_s: float
    """A review right after a LocalQueue status update (the store rebuilds the policy)."""
    profile: str = ""


def _per_call(
    clock: Clock, call: Callable[[Any], object], items: Sequence[Any], repeat: int = 5
) -> float:
    """Seconds per call, the best of ``repeat`` passes (as ``timeit`` does): on a shared
    machine the slower passes measure the neighbours."""
    best = math.inf
    for _ in range(repeat):
        start = clock.monotonic()
        for item in items:
            call(item)
        best = min(best, (clock.monotonic() - start) / max(1, len(items)))
    return best


def measure_in_process(
    policy_path: Path, template: ReviewTemplate, reviews: int, profile_top: int, clock: Clock
) -> InProcess:
    """``review()`` alone (no HTTP, no TLS) as the server calls it, its stages, the policy
    build, and a review that follows a change to any Kueue object."""
    store = PolicyStore(clock)
    store.load_file(str(policy_path))
    start = clock.monotonic()
    policy = store.current()
    build = clock.monotonic() - start
    assert policy is not None
    config = AdmitConfig()
    prefix = uid_prefix()
    bodies = [template.body(f"{prefix}{i:012x}") for i in range(reviews)]
    review(bodies[0], policy, config)
    per_review = _per_call(clock, lambda body: review(body, policy, config), bodies)

    def first_time(body: bytes) -> object:
        policy.answers.clear()
        return review(body, policy, config)

    per_first = _per_call(clock, first_time, bodies)

    requests = [decode_review(body) for body in bodies]
    decisions = [admit(request, policy, config) for request in requests]
    allowed = [d for d in decisions if isinstance(d, Allowed)]
    if len(allowed) != len(decisions):
        raise BenchError("the policy does not admit the captured Job")
    patches = [diff(r.object, d.object) for r, d in zip(requests, allowed, strict=True)]
    stages = (
        ("decode (orjson + pydantic)", _per_call(clock, decode_review, bodies)),
        ("admit (the nine rules)", _per_call(clock, lambda r: admit(r, policy, config), requests)),
        (
            "diff (JSON Patch)",
            _per_call(
                clock,
                lambda rd: diff(rd[0].object, rd[1].object),
                list(zip(requests, allowed, strict=True)),
            ),
        ),
        (
            "encode the answer",
            _per_call(
                clock,
                lambda rp: encode_response(rp[0].uid, allowed=True, patch=rp[1]),
                list(zip(requests, patches, strict=True)),
            ),
        ),
    )

    # Kueue writes LocalQueue status (pending and admitted counts) as workloads move; the
    # webhook's watch hands every such update to the store.
    queue = next(
        o
        for o in load_objects(policy_path)
        if o.get("kind") == "LocalQueue"
        and o["metadata"].get("namespace") == CAPTURED_NAMESPACE
        and o["metadata"]["name"] == CAPTURED_QUEUE
    )
    after: list[float] = []
    for n in range(5):
        store.event("localqueues", "MODIFIED", {**queue, "status": {"pendingWorkloads": n}})
        start = clock.monotonic()
        review(bodies[n], store.current(), config)
        after.append(clock.monotonic() - start)

    text = ""
    if profile_top:
        profiler = cProfile.Profile()
        profiler.enable()
        for body in bodies:
            review(body, policy, config)
        profiler.disable()
        buffer = io.StringIO()
        stats = pstats.Stats(profiler, stream=buffer)
        stats.sort_stats("tottime").print_stats(profile_top)
        text = buffer.getvalue()
    return InProcess(
        reviews, per_review, per_first, stages, build, sorted(after)[len(after) // 2], text
    )


# ---------------------------------------------------------------- report


def _templates(count: int) -> str:
    if count <= 1:
        return "the same Job each time, renamed"
    kept = "all kept" if count <= ANSWERS_KEPT else "more than the webhook keeps"
    return f"{count:,} distinct Jobs in turn, {kept}"


def _ms(seconds: float) -> str:
    if seconds == math.inf:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds * 1000:.1f} ms"


def _mb(value: int) -> str:
    return f"{value / MB:.1f} MB"


def _per_core(cpu_per_review: float) -> str:
    return f"{1 / cpu_per_review:,.0f}" if cpu_per_review > 0 else "-"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


STEP_HEADER: Final = (
    f"{'server':<9} {'offered/s':>9} {'achieved/s':>10} {'ok':>7} {'err':>4} {'p50':>9} "
    f"{'p90':>9} {'p99':>9} {'p99.9':>9} {'max':>9} {'lag p99':>9} {'late p99':>9} "
    f"{'srv CPU':>7} {'CPU/rev':>7}  verdict"
)


def step_line(result: StepResult) -> str:
    run, lat = result.run, result.latency
    return (
        f"{result.spec.server:<9} {result.spec.rate:>9,.0f} {run.achieved_rate:>10,.1f} "
        f"{run.ok:>7,} {run.error_count:>4} {_ms(lat.p50):>9} {_ms(lat.p90):>9} "
        f"{_ms(lat.p99):>9} {_ms(lat.p999):>9} {_ms(lat.maximum):>9} "
        f"{_ms(run.lag.summary().p99):>9} {_ms(run.late.summary().p99):>9} "
        f"{result.server_cpu:>7.0%} {result.cpu_per_review * 1e6:>5.0f}us"
        f"  {result.verdict or run.stopped}"
    ).rstrip()


@dataclass(frozen=True, slots=True)
class Scaled:
    """Issue 4's rate targets scaled to this machine by the baseline's capacity here.

    The baseline's capacity is one core over its CPU per review at the fixed rate (from
    ``/proc``: a neighbour's time slice delays requests but does not bill the server),
    so the factor holds when tail latencies are a co-tenant's."""

    factor: float
    """This run's baseline capacity over ``ISSUE_BASELINE_RATE``."""
    throughput: StepResult
    """The webhook at ``TARGET_RATE * factor``, judged like a search step."""
    latency: dict[str, StepResult]
    """Each server at ``TARGET_P99_AT * factor``."""

    def lines(self) -> Iterator[str]:
        yield (
            f"== targets of issue 4 scaled to this machine: the baseline's capacity here is "
            f"{self.factor * ISSUE_BASELINE_RATE:,.0f}/s, x{self.factor:.2f} the "
            f"{ISSUE_BASELINE_RATE:,.0f}/s of the issue's machine =="
        )
        yield STEP_HEADER
        yield step_line(self.throughput)
        for result in self.latency.values():
            yield step_line(result)
        hook = self.latency.get("webhook")
        base = self.latency.get("baseline")
        yield _target(
            f">= {TARGET_RATE * self.factor:,.0f} reviews/s sustained",
            f"{self.throughput.run.achieved_rate:,.0f}/s",
            self.throughput.passed,
        )
        if hook is not None:
            p99 = hook.latency.p99
            yield _target(
                f"p99 <= {_ms(TARGET_P99_S)} at {hook.spec.rate:,.0f} reviews/s",
                _ms(p99),
                p99 <= TARGET_P99_S and hook.run.error_count == 0,
            )
            if base is not None:
                yield f"  (the baseline's p99 at the same rate: {_ms(base.latency.p99)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "baseline_capacity_per_s": self.factor * ISSUE_BASELINE_RATE,
            "throughput": self.throughput.to_json(),
            "latency": {name: r.to_json() for name, r in self.latency.items()},
        }


@dataclass(slots=True)
class Report:
    args: argparse.Namespace
    queues: int
    servers: dict[str, Server] = field(default_factory=dict)
    warmups: dict[str, StepResult] = field(default_factory=dict)
    fixed: dict[str, StepResult] = field(default_factory=dict)
    searches: dict[str, list[StepResult]] = field(default_factory=dict)
    scaled: Scaled | None = None
    in_process: InProcess | None = None
    wall_s: float = 0.0
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """``os.getloadavg()`` at the start and the end: how busy the (shared) machine was."""

    def lines(self) -> Iterator[str]:
        args = self.args
        yield (
            f"Tessera webhook benchmark: captured Job review "
            f"({_templates(args.templates)}), {self.queues:,} LocalQueues, "
            f"TLS, {args.connections} keep-alive connections, open loop"
        )
        yield (
            f"servers pinned to CPU {args.server_core}, load generator to CPU "
            f"{args.client_core}{f' (nice {args.nice})' if args.nice else ''}; latency is "
            "measured from each request's intended send time"
        )
        for server in self.servers.values():
            yield f"  {server.name:<9} {server.command}"
        yield f"CPU: {cpu_model()}; load average {_loads(self.load)}"
        if self.fixed:
            yield ""
            yield f"== fixed rate: {args.rate:,.0f} reviews/s for {args.duration:g} s =="
            yield STEP_HEADER
            for result in self.fixed.values():
                yield step_line(result)
            yield from self._fixed_ratios()
        if self.searches:
            yield ""
            yield (
                f"== max-throughput search: p99 <= {args.p99_bound_ms:g} ms, no errors, "
                f"achieved >= {args.min_achieved:.0%} of offered; {args.step_duration:g} s steps =="
            )
            yield STEP_HEADER
            for results in self.searches.values():
                for result in results:
                    yield step_line(result)
            yield from self._search_summary()
        yield ""
        yield "== memory (/proc VmRSS; peak = VmHWM) =="
        yield (
            f"{'server':<9} {'idle':>9} {'1st review':>10} {'end':>9} {'peak':>9}  "
            "first review (cold)"
        )
        for server in self.servers.values():
            rss = {m: v.get("VmRSS", 0) for m, v in server.memory.items()}
            peak = max((v.get("VmHWM", 0) for v in server.memory.values()), default=0)
            yield (
                f"{server.name:<9} {_mb(rss.get('idle', 0)):>9} "
                f"{_mb(rss.get('first-review', 0)):>10} {_mb(rss.get('end', 0)):>9} "
                f"{_mb(peak):>9}  {_ms(server.first_review_s)}"
                f" ({server.patch_ops} patch operations)"
            )
        if self.in_process is not None:
            ip = self.in_process
            yield ""
            yield "== in process (no HTTP, no TLS), per call, best of 5 passes =="
            calls = f"({ip.reviews:,} calls)"
            yield f"review() as the server calls it   {ip.review_s * 1e6:>7.0f} us  {calls}"
            yield "  (a renamed Job gets the answer kept for its template: webhook.answers)"
            yield f"review() of a template's first Job {ip.first_s * 1e6:>6.0f} us, in parts:"
            for name, seconds in ip.stages:
                yield f"  {name:<31} {seconds * 1e6:>7.0f} us"
            yield f"policy build ({self.queues:,} LocalQueues)  {_ms(ip.policy_build_s):>10}"
            yield f"review after a LocalQueue update  {_ms(ip.after_change_s):>10}  (median of 5)"
            if ip.profile:
                yield ip.profile.rstrip()
        yield from self._targets()
        if self.scaled is not None:
            yield ""
            yield from self.scaled.lines()
        yield ""
        yield f"wall time {self.wall_s:.0f} s"

    def _fixed_ratios(self) -> Iterator[str]:
        hook, base = self.fixed.get("webhook"), self.fixed.get("baseline")
        if hook is None or base is None:
            return
        h, b = hook.latency, base.latency
        yield (
            f"webhook/baseline: p50 x{_ratio(h.p50, b.p50)}, p90 x{_ratio(h.p90, b.p90)}, "
            f"p99 x{_ratio(h.p99, b.p99)}, p99.9 x{_ratio(h.p999, b.p999)}"
        )
        hook_cpu, base_cpu = hook.cpu_per_review, base.cpu_per_review
        yield (
            f"server CPU per review: webhook {hook_cpu * 1e6:.0f} us, baseline "
            f"{base_cpu * 1e6:.0f} us (x{_ratio(hook_cpu, base_cpu)}): a whole core would "
            f"answer about {_per_core(hook_cpu)} and {_per_core(base_cpu)} reviews/s"
        )

    def _search_summary(self) -> Iterator[str]:
        best = {name: max_sustained(results) for name, results in self.searches.items()}
        parts = []
        for name, result in best.items():
            if result is None:
                parts.append(f"{name}: none sustained")
            else:
                parts.append(
                    f"{name}: {result.spec.rate:,.0f}/s (p99 {_ms(result.latency.p99)}, "
                    f"server CPU {result.server_cpu:.0%})"
                )
        yield "max sustained: " + "; ".join(parts)
        hook, base = best.get("webhook"), best.get("baseline")
        if hook is not None and base is not None:
            yield f"webhook/baseline max throughput: {_ratio(hook.spec.rate, base.spec.rate)}"

    def _targets(self) -> Iterator[str]:
        server = self.servers.get("webhook")
        if server is None:
            return
        yield ""
        yield "== targets of issue 4 (webhook) =="
        results = self.searches.get("webhook")
        if results:
            best = max_sustained(results)
            rate = best.spec.rate if best else 0.0
            yield _target(
                f">= {TARGET_RATE:,.0f} reviews/s sustained",
                f"{rate:,.0f}/s",
                rate >= TARGET_RATE,
            )
        fixed = self.fixed.get("webhook")
        if fixed is not None and self.args.rate == TARGET_P99_AT:
            yield _target(
                f"p99 <= {_ms(TARGET_P99_S)} at {self.args.rate:,.0f} reviews/s",
                _ms(fixed.latency.p99),
                fixed.latency.p99 <= TARGET_P99_S and fixed.run.error_count == 0,
            )
        peak = max((v.get("VmHWM", 0) for v in server.memory.values()), default=0)
        yield _target(
            f"RSS <= {_mb(TARGET_RSS)} with {self.queues:,} LocalQueues",
            f"peak {_mb(peak)}",
            peak <= TARGET_RSS,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
            },
            "local_queues": self.queues,
            "cpus": sorted(os.sched_getaffinity(0)),
            "python": sys.version.split()[0],
            "wall_s": self.wall_s,
            "cpu_model": cpu_model(),
            "load_average": self.load,
            "servers": {},
        }
        for name, server in self.servers.items():
            results = self.searches.get(name, [])
            best = max_sustained(results)
            out["servers"][name] = {
                "command": server.command,
                "memory": server.memory,
                "first_review_s": server.first_review_s,
                "patch_ops": server.patch_ops,
                "warm_up": self.warmups[name].to_json() if name in self.warmups else None,
                "fixed": self.fixed[name].to_json() if name in self.fixed else None,
                "search": [r.to_json() for r in results],
                "max_sustained_rate": best.spec.rate if best else None,
            }
        if self.scaled is not None:
            out["scaled"] = self.scaled.to_json()
        if self.in_process is not None:
            ip = self.in_process
            out["in_process"] = {
                "reviews": ip.reviews,
                "review_s": ip.review_s,
                "first_review_s": ip.first_s,
                "stages_s": dict(ip.stages),
                "policy_build_s": ip.policy_build_s,
                "review_after_change_s": ip.after_change_s,
            }
        return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def _loads(load: dict[str, tuple[float, float, float]]) -> str:
    return ", ".join(f"{moment} {avg[0]:.1f}" for moment, avg in load.items())


def _target(what: str, value: str, met: bool) -> str:
    return f"{what:<40} {value:>14}  {'met' if met else 'MISSED'}"


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.webhook",
        description="Benchmark the admission webhook against a bare baseline server, "
        "both on one core, open loop over TLS.",
        epilog="examples:\n"
        "  python -m loadtest.bench.webhook\n"
        "  python -m loadtest.bench.webhook --rate 2000 --duration 10 --queues 1000 "
        "--json bench.json\n"
        "  python -m loadtest.bench.webhook --no-search --servers webhook --profile 25\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--rate", type=float, default=2000.0, help="fixed-rate run, reviews/s (2000)")
    add("--duration", type=float, default=10.0, help="fixed-rate run, seconds (10)")
    add("--warmup", type=float, default=2.0, help="warm-up per server, seconds (2)")
    add("--queues", type=int, default=1000, help="LocalQueues in the generated policy (1000)")
    add(
        "--templates",
        type=int,
        default=1,
        help="distinct Jobs sent in turn, each the captured one annotated with its number "
        "(1: the captured Job every time, so from the second review on the webhook answers "
        "from what it kept for it; above 1,024 every review runs the rules)",
    )
    add("--policy-file", type=Path, help="use this policy instead of generating one")
    add("--captures", type=Path, default=DEFAULT_CAPTURES, help="folder of the wire captures")
    add("--connections", type=int, default=8, help="keep-alive TLS connections (8)")
    add("--servers", default="baseline,webhook", help="which servers (baseline,webhook)")
    add("--search", action=argparse.BooleanOptionalAction, default=True, help="max-rate search")
    add("--search-start", type=float, default=1000.0, help="first search rate (1000)")
    add("--search-factor", type=float, default=1.5, help="rate multiplier per step (1.5)")
    add("--refine", type=int, default=3, help="bisection steps after the first failure (3)")
    add(
        "--retry",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a failed search step once more before believing it",
    )
    add("--max-steps", type=int, default=16, help="search steps per server at most (16)")
    add("--step-duration", type=float, default=5.0, help="seconds per search step (5)")
    add(
        "--p99-bound-ms",
        type=float,
        default=50.0,
        help="search: a step whose p99 exceeds this failed (50: a queue building up "
        "at saturation, not the odd co-tenant on a shared machine)",
    )
    add("--min-achieved", type=float, default=0.97, help="search: achieved/offered (0.97)")
    add("--timeout", type=float, default=5.0, help="request timeout, seconds (5)")
    add("--max-lag", type=float, default=1.0, help="stop a step this far behind, s (1)")
    add("--max-requests", type=int, default=500_000, help="requests per step at most")
    add("--budget", type=float, default=420.0, help="stop searching after this many s (420)")
    add("--server-core", type=int, default=0, help="CPU for the servers (0)")
    add("--client-core", type=int, default=1, help="CPU for the load generator (1)")
    add(
        "--nice",
        type=int,
        default=0,
        help="niceness of servers and load generator (0); on a shared machine a negative "
        "value (root only) keeps co-tenants from taking the pinned cores",
    )
    add(
        "--scaled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the issue's rate targets scaled by this run's baseline capacity "
        "(needs both servers)",
    )
    add("--in-process", type=int, default=1000, help="review() calls timed in process (1000)")
    add("--profile", type=int, default=0, metavar="N", help="cProfile: print the top N")
    add("--seed", type=int, default=1, help="seed of the generated policy")
    add("--json", type=Path, help="write the results as JSON here")
    return parser.parse_args(argv)


def _check_cores(args: argparse.Namespace) -> None:
    available = os.sched_getaffinity(0)
    wanted = {args.server_core, args.client_core}
    if not wanted <= available or len(wanted) < 2:
        raise BenchError(
            f"need two distinct CPUs for --server-core/--client-core, this process may use "
            f"{sorted(available)}"
        )
    if args.nice < 0 and os.geteuid() != 0:
        raise BenchError("a negative --nice needs root")


@contextmanager
def _temporary_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> Report:
    started = clock.monotonic()
    _check_cores(args)
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if not names or not set(names) <= {"baseline", "webhook"}:
        raise BenchError("--servers takes baseline, webhook or both")
    captured = load_captured_review(args.captures)
    template = ReviewTemplate.of(captured, args.templates)
    # The orchestrator only waits; keep it off the servers' core.
    os.sched_setaffinity(0, {args.client_core})
    with _temporary_folder() as tmp, ExitStack() as stack:
        if args.policy_file is not None:
            policy_path = args.policy_file
            queues = sum(
                1
                for o in yaml.safe_load_all(policy_path.read_text())
                if o and o.get("kind") == "LocalQueue"
            )
        else:
            policy_path = tmp / "policy.yaml"
            objects = policy_objects(args.queues, args.seed)
            write_policy(policy_path, objects)
            queues = sum(1 for o in objects if o["kind"] == "LocalQueue")
        report = Report(args, queues)
        report.load["start"] = os.getloadavg()
        say(f"policy: {queues:,} LocalQueues in {policy_path}")
        make_certs(tmp / "certs")
        cert, key, ca = (tmp / "certs" / n for n in ("webhook.crt", "webhook.key", "ca.crt"))
        tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
        for name in names:
            port = free_port()
            if name == "webhook":
                server = Server(
                    name,
                    "webhook",
                    [
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        *tls,
                        "--policy-file",
                        str(policy_path),
                    ],
                    args.server_core,
                    tmp / f"{name}.log",
                    args.nice,
                    port,
                )
            else:
                server = Server(
                    name,
                    "loadtest.bench.baseline_webhook",
                    ["--host", "127.0.0.1", "--port", str(port), *tls],
                    args.server_core,
                    tmp / f"{name}.log",
                    args.nice,
                    port,
                )
            server.start(stack)
            report.servers[name] = server
        for server in report.servers.values():
            uvloop.run(_probe(server, ca, template, clock, deadline_s=60.0))
            say(f"{server.name}: ready, first review {_ms(server.first_review_s)}")

        def spec(server: Server, mode: str, rate: float, duration: float) -> StepSpec:
            return StepSpec(
                server=server.name,
                mode=mode,
                port=server.port,
                server_pid=server.pid,
                ca=str(ca),
                template=template,
                rate=rate,
                duration_s=duration,
                connections=args.connections,
                core=args.client_core,
                nice=args.nice,
                timeout_s=args.timeout,
                max_lag_s=args.max_lag,
                max_requests=args.max_requests,
            )

        fixed_criteria = Criteria(TARGET_P99_S, args.min_achieved)
        for server in report.servers.values():
            if args.warmup > 0:
                report.warmups[server.name] = run_step(
                    spec(server, "warm-up", args.rate, args.warmup)
                )
            server.note_memory("warm")
        for server in report.servers.values():
            result = fixed_criteria.judge(run_step(spec(server, "fixed", args.rate, args.duration)))
            report.fixed[server.name] = result
            say(step_line(result))
        if args.search:
            criteria = Criteria(args.p99_bound_ms / 1000, args.min_achieved)
            plan = SearchPlan(
                args.search_start,
                args.search_factor,
                args.refine,
                args.max_steps,
                args.step_duration,
                args.retry,
            )
            for server in report.servers.values():

                def step(rate: float, server: Server = server) -> StepResult:
                    result = run_step(spec(server, "search", rate, plan.duration_s))
                    say(step_line(criteria.judge(result)))
                    return result

                report.searches[server.name] = search(
                    plan, criteria, step, lambda: clock.monotonic() - started > args.budget
                )
        base_fixed = report.fixed.get("baseline")
        if args.scaled and "webhook" in report.servers and base_fixed is not None:
            factor = 1 / (base_fixed.cpu_per_review * ISSUE_BASELINE_RATE)
            judge = Criteria(args.p99_bound_ms / 1000, args.min_achieved).judge
            webhook = report.servers["webhook"]
            throughput = judge(
                run_step(spec(webhook, "scaled", _round_rate(TARGET_RATE * factor), args.duration))
            )
            say(step_line(throughput))
            latency = {}
            for server in report.servers.values():
                rate = _round_rate(TARGET_P99_AT * factor)
                latency[server.name] = judge(run_step(spec(server, "scaled", rate, args.duration)))
                say(step_line(latency[server.name]))
            report.scaled = Scaled(factor, throughput, latency)
        for server in report.servers.values():
            server.note_memory("end")
        if "webhook" in report.servers and (args.in_process or args.profile):
            report.in_process = measure_in_process(
                policy_path, template, max(args.in_process, 1), args.profile, clock
            )
    report.load["end"] = os.getloadavg()
    report.wall_s = clock.monotonic() - started
    return report


class Reported(Protocol):
    def lines(self) -> Iterable[str]: ...
    def to_json(self) -> dict[str, Any]: ...


def run_and_report(
    prog: str,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, Clock, Callable[[str], None]], Reported],
) -> int:
    """A benchmark's command: progress on stderr, the report on stdout (and as JSON to
    ``args.json``), exit 1 with the reason when it cannot be measured."""
    try:
        report = run(args, SystemClock(), lambda line: print(line, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    if args.json is not None:
        args.json.write_bytes(jsonio.dumps_pretty(report.to_json()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_report("python -m loadtest.bench.webhook", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
