"""Tessera's webhook side by side with Kueue's: the same Job AdmissionReviews to both, in
one run (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts a control plane and
servers, prints a table). Must not be imported by the servers or run by pytest, except
by the e2e test that runs the command.

``python -m loadtest bench-webhook --against kueue [--duration 20 --json F]``:

1. brings up etcd, kube-apiserver and the real Kueue manager (the pinned release of
   ``make e2e-assets``; ``loadtest.stack.cluster.bring_up_kueue``), creates the
   namespaces and applies to it the queue policy that ``bench_webhook`` generates (the
   captured Job's ``team-nlp/team-nlp-queue`` among them), and starts ``python -m
   webhook`` with the same policy as a file;
2. runs both servers on the same CPU (``--server-core``; Kueue's manager is pinned before
   it starts, so Go sizes ``GOMAXPROCS`` to it) and the load generator on another
   (``--client-core``), as ``bench_webhook`` does: the webhook is one process on one
   core, so Kueue gets one core too (``--kueue-cores 0,1`` gives it more);
3. for each variant of the captured Job (``VARIANTS``), sends its reviews over keep-alive
   TLS connections that verify each server's CA, to Kueue's ``/mutate-batch-v1-job`` and
   to Tessera's ``/mutate``, with the open-loop generator of ``bench_webhook``
   (``loadtest.bench.review_steps``), in slices that alternate between the two servers (so a
   neighbour's burst hits both): first at saturation (offered far above what either
   serves, so every connection sends its next review as soon as its answer is in: the
   achieved rate is the throughput with ``--connections`` reviews in flight), then at
   fixed rates, fractions (``--loads``) of the lower of the two throughputs;
4. prints, per variant and as Tessera/Kueue ratios: the throughput at saturation, the
   p50/p99 at each fixed rate (from each request's intended send time), and each
   server's CPU per review (from ``/proc`` of its process, all its threads); with
   ``--json``, the same as JSON.

An answer counts only if it is a 200 that admits the review with the expected patch:
Tessera always patches; Kueue has nothing to write for a Job that is already suspended,
and sets ``spec.suspend`` on one that is not.
"""

from __future__ import annotations

import argparse
import base64
import copy
import math
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import uvloop
import yaml

from cluster import jsonio
from cluster.clock import Clock
from loadtest.bench.command import run_and_report
from loadtest.bench.review_steps import (
    HEADERS,
    MUTATE_PATH,
    ReviewTemplate,
    Server,
    StepResult,
    StepSpec,
    check_answer,
    run_step,
    uid_prefix,
    wait_ready,
)
from loadtest.bench.search import round_rate
from loadtest.bench.webhook_policy import (
    DEFAULT_CAPTURES,
    load_captured_review,
    policy_objects,
    write_policy,
)
from loadtest.measure.openloop import Http1Connection
from loadtest.measure.pinned import SERVER_NAME, BenchError, cpu_model, make_certs
from loadtest.measure.stats import Histogram
from loadtest.stack import kueue as kueue_stack
from loadtest.stack.cluster import KueueOnly, bring_up_kueue
from loadtest.stack.controlplane import (
    BinariesUnavailableError,
    find_binaries,
    find_crds,
    find_kueue,
)
from server.tls import client_context

KUEUE_PATH: Final = "/mutate-batch-v1-job?timeout=5s"
"""Kueue's Job defaulting webhook, with the timeout kube-apiserver adds."""
KUEUE_SERVER_NAME: Final = f"{kueue_stack.SERVICE}.{kueue_stack.NAMESPACE}.svc"
SATURATION_RATE: Final = 1_000_000.0
"""Offered at saturation: far above either server, so the connections never wait for a
due time and the run is bounded by its lag (``--slice`` seconds), not its schedule."""
DISTINCT: Final = 2**62
"""Template numbers of a variant whose bodies all differ: none repeats within a run."""
STEP_INDEX_SPAN: Final = 2**32
"""Each step sends template numbers from its own range of this size."""
HOW_TO_GET: Final = (
    "the Kubernetes binaries and Kueue v0.17.0 are not built: run `make e2e-assets` "
    "(needs Go >= 1.26; see tests/e2e/README.md), then run this again"
)
SERVERS: Final = ("tessera", "kueue")


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    what: str
    renamed: bool
    templates: int
    suspended: bool


VARIANTS: Final = (
    Variant("same", "the captured Job (suspended), the same body every time", False, 1, True),
    Variant(
        "renamed",
        "the captured Job under a new name each time (Tessera answers from what it kept)",
        True,
        1,
        True,
    ),
    Variant(
        "distinct",
        "the captured Job, renamed and annotated with a new number each time (every "
        "answer computed)",
        True,
        DISTINCT,
        True,
    ),
    Variant(
        "unsuspended",
        "the captured Job without spec.suspend, every body distinct as above (Kueue "
        "writes a patch too)",
        True,
        DISTINCT,
        False,
    ),
)


def unsuspended(review_body: dict[str, Any]) -> dict[str, Any]:
    """The captured review of a Job created without ``spec.suspend``."""
    out = copy.deepcopy(review_body)
    out["request"]["object"]["spec"].pop("suspend", None)
    return out


# ---------------------------------------------------------------- pooled slices


@dataclass(slots=True)
class Pooled:
    """One server's slices of one phase, added up."""

    sent: int = 0
    ok: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)
    """From each request's intended send time (at saturation every request is due at
    once, so there it only says how long the run was: see ``service``)."""
    service: Histogram = field(default_factory=Histogram)
    """From each request's actual send time to its answer."""
    slices: int = 0

    def add(self, step: StepResult) -> None:
        run = step.run
        self.sent += run.sent
        self.ok += run.ok
        self.elapsed_s += run.elapsed_s
        self.cpu_s += step.server_cpu * run.elapsed_s
        self.errors.update(run.errors)
        self.latency.merge(run.latency)
        self.service.merge(run.service)
        self.slices += 1

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cpu_per_review(self) -> float:
        return self.cpu_s / self.sent if self.sent else 0.0

    def p(self, q: float) -> float:
        return self.latency.percentile(q) if self.latency.count else math.inf

    def service_p(self, q: float) -> float:
        return self.service.percentile(q) if self.service.count else math.inf

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "elapsed_s": self.elapsed_s,
            "achieved_rate": self.rate,
            "server_cpu_s": self.cpu_s,
            "server_cpu_per_review_s": self.cpu_per_review,
            "latency": self.latency.summary().to_json() if self.latency.count else None,
            "service": self.service.summary().to_json() if self.service.count else None,
            "slices": self.slices,
        }


@dataclass(slots=True)
class VariantResult:
    variant: Variant
    patches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each server's JSON Patch for the variant's first review (empty: none)."""
    saturation: dict[str, Pooled] = field(default_factory=dict)
    fixed: dict[float, dict[str, Pooled]] = field(default_factory=dict)

    def ratio(self, value: Callable[[Pooled], float], phase: dict[str, Pooled]) -> float:
        tessera, kueue = value(phase["tessera"]), value(phase["kueue"])
        return tessera / kueue if kueue and math.isfinite(tessera / kueue) else math.inf

    def ratios(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "throughput": self.ratio(lambda p: p.rate, self.saturation),
            "cpu_per_review": self.ratio(lambda p: p.cpu_per_review, self.saturation),
            "p50": {},
            "p99": {},
            "fixed_cpu_per_review": {},
        }
        for rate, phase in self.fixed.items():
            out["p50"][rate] = self.ratio(lambda p: p.p(50), phase)
            out["p99"][rate] = self.ratio(lambda p: p.p(99), phase)
            out["fixed_cpu_per_review"][rate] = self.ratio(lambda p: p.cpu_per_review, phase)
        return out

    def errors(self) -> int:
        phases = [self.saturation, *self.fixed.values()]
        return sum(sum(p.errors.values()) for phase in phases for p in phase.values())

    def target_met(self) -> bool:
        """Tessera at least Kueue's throughput, its p99 no worse at every fixed rate, and
        every answer as expected."""
        ratios = self.ratios()
        return (
            ratios["throughput"] >= 1.0
            and all(r <= 1.0 for r in ratios["p99"].values())
            and self.errors() == 0
        )

    def to_json(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {
            "what": self.variant.what,
            "suspended": self.variant.suspended,
            "patches": self.patches,
            "saturation": {name: p.to_json() for name, p in self.saturation.items()},
            "fixed": [
                {"rate": rate, **{name: p.to_json() for name, p in phase.items()}}
                for rate, phase in self.fixed.items()
            ],
            "ratios": {
                **ratios,
                "p50": [{"rate": r, "ratio": x} for r, x in ratios["p50"].items()],
                "p99": [{"rate": r, "ratio": x} for r, x in ratios["p99"].items()],
                "fixed_cpu_per_review": [
                    {"rate": r, "ratio": x} for r, x in ratios["fixed_cpu_per_review"].items()
                ],
            },
            "target_met": self.target_met(),
        }


# ---------------------------------------------------------------- the servers


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one server takes reviews, and how the generator checks its answers."""

    name: str
    port: int
    pid: int
    ca: Path
    server_name: str
    path: str
    command: str
    cpus: tuple[int, ...]

    def patches(self, variant: Variant) -> bool:
        """Whether its answer to the variant carries a patch."""
        return self.name == "tessera" or not variant.suspended


async def _first_review(endpoint: Endpoint, body: bytes, uid: str, patch: bool) -> list[Any]:
    """One review, checked: the patch it answered with (decoded; empty for none)."""
    connection = Http1Connection(
        "127.0.0.1",
        endpoint.port,
        ssl_context=client_context(endpoint.ca),
        server_hostname=endpoint.server_name,
        headers=HEADERS,
    )
    try:
        answer = await connection.request("POST", endpoint.path, body)
    finally:
        connection.close()
    try:
        response = check_answer(answer.status, answer.body, uid, patch=patch)
    except Exception as exc:
        raise BenchError(f"{endpoint.name} did not answer the review as expected: {exc}") from None
    return list(jsonio.loads(base64.b64decode(response["patch"]))) if patch else []


def _find_assets() -> tuple[Path, Path, Path]:
    try:
        return (
            find_binaries(progress=sys.stderr),
            find_crds(progress=sys.stderr),
            find_kueue(progress=sys.stderr),
        )
    except BinariesUnavailableError:
        raise BenchError(HOW_TO_GET) from None
    except RuntimeError as exc:
        raise BenchError(f"{HOW_TO_GET}\n{exc}") from None


def kueue_valid(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policy as Kueue's validation takes it: ``bench_webhook`` leaves a flavor's
    quota of a covered resource out when it has none (Tessera reads that as zero), Kueue
    wants every covered resource listed, so the missing ones get a quota of 0. Both
    servers are given this policy."""
    out = []
    for original in objects:
        obj = original
        if obj["kind"] == "ClusterQueue":
            obj = copy.deepcopy(obj)
            for group in obj["spec"]["resourceGroups"]:
                covered = group["coveredResources"]
                for flavor in group["flavors"]:
                    listed = {r["name"]: r for r in flavor["resources"]}
                    flavor["resources"] = [
                        listed.get(name, {"name": name, "nominalQuota": 0}) for name in covered
                    ]
        out.append(obj)
    return out


def _install_policy(stack: KueueOnly, folder: Path, objects: Sequence[dict[str, Any]]) -> None:
    """The namespaces of the policy's LocalQueues, then the policy, through Kueue's own
    validating webhooks as an admin would apply it."""
    namespaces = sorted({o["metadata"]["namespace"] for o in objects if o["kind"] == "LocalQueue"})
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces
        ],
    }
    stack.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(listed))
    path = folder / "kueue-policy.yaml"
    write_policy(path, objects)
    done = stack.plane.kubectl("apply", "--server-side", "-f", str(path), check=False)
    if done.returncode != 0:
        raise BenchError(f"Kueue did not take the queue policy: {done.stderr.strip()[:2000]}")


# ---------------------------------------------------------------- the run


@dataclass(slots=True)
class Report:
    args: argparse.Namespace
    queues: int
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    variants: list[VariantResult] = field(default_factory=list)
    wall_s: float = 0.0
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def lines(self) -> Iterator[str]:
        args = self.args
        yield (
            f"Tessera's webhook vs Kueue v0.17.0's: captured Job reviews, "
            f"{self.queues:,} LocalQueues, TLS, {args.connections} keep-alive connections, "
            f"open loop, {args.slice:g} s slices alternating between the servers, "
            f"{args.duration:g} s per server and phase"
        )
        for endpoint in self.endpoints.values():
            cpus = ",".join(map(str, endpoint.cpus))
            yield f"  {endpoint.name:<8} on CPU {cpus}: {endpoint.command}"
        yield f"  load generator on CPU {args.client_core}; CPU: {cpu_model()}"
        yield f"  load average {', '.join(f'{k} {v[0]:.1f}' for k, v in self.load.items())}"
        for result in self.variants:
            yield ""
            yield from _variant_lines(result)
        yield ""
        yield "== Tessera/Kueue (throughput: higher is better; p99 and CPU: lower is better) =="
        rates = max((len(r.fixed) for r in self.variants), default=0)
        head = f"{'variant':<12} {'throughput':>10} {'CPU/review':>10}"
        head += "".join(f" {f'p99 @{i + 1}':>9}" for i in range(rates))
        yield head + "  target (>= 1.0x throughput, p99 no worse)"
        for result in self.variants:
            ratios = result.ratios()
            line = f"{result.variant.name:<12} {_x(ratios['throughput']):>10} "
            line += f"{_x(ratios['cpu_per_review']):>10}"
            line += "".join(f" {_x(x):>9}" for x in ratios["p99"].values())
            line += "  " + ("met" if result.target_met() else "MISSED")
            yield line
        yield "(@1, @2...: the fixed rates of each variant, as listed above)"
        yield ""
        yield f"wall time {self.wall_s:.0f} s"

    def to_json(self) -> dict[str, Any]:
        return {
            "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
            },
            "local_queues": self.queues,
            "cpu_model": cpu_model(),
            "load_average": self.load,
            "wall_s": self.wall_s,
            "servers": {
                name: {"command": e.command, "cpus": list(e.cpus), "path": e.path}
                for name, e in self.endpoints.items()
            },
            "variants": {r.variant.name: r.to_json() for r in self.variants},
        }


def _x(ratio: float) -> str:
    return f"x{ratio:.2f}" if math.isfinite(ratio) else "-"


def _ms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1000:.2f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


def _patch_text(ops: Sequence[dict[str, Any]]) -> str:
    if not ops:
        return "no patch"
    paths = ", ".join(sorted({str(op.get("path")) for op in ops})[:4])
    more = "..." if len({op.get("path") for op in ops}) > 4 else ""
    return f"{len(ops)} operations ({paths}{more})"


def _variant_lines(result: VariantResult) -> Iterator[str]:
    variant = result.variant
    yield f"== {variant.name}: {variant.what} =="
    yield "  (latency at saturation: from sending each review; at fixed rates: from when due)"
    for name, ops in result.patches.items():
        yield f"  {name:<8} answers with {_patch_text(ops)}"
    yield (
        f"{'phase':<16} {'server':<8} {'achieved/s':>10} {'ok':>8} {'err':>4} {'p50':>9} "
        f"{'p99':>9} {'p99.9':>9} {'CPU/review':>10}"
    )
    phases = [("saturation", result.saturation)]
    phases += [(f"fixed {rate:,.0f}/s", phase) for rate, phase in result.fixed.items()]
    for label, phase in phases:
        for name, pooled in phase.items():
            # at saturation every request is due at once: the time from sending it counts
            p = pooled.service_p if label == "saturation" else pooled.p
            yield (
                f"{label:<16} {name:<8} {pooled.rate:>10,.0f} {pooled.ok:>8,} "
                f"{sum(pooled.errors.values()):>4} {_ms(p(50)):>9} {_ms(p(99)):>9} "
                f"{_ms(p(99.9)):>9} {pooled.cpu_per_review * 1e6:>8.0f}us"
            )
        if label == "saturation":
            yield (
                f"  tessera/kueue: throughput {_x(result.ratio(lambda p: p.rate, phase))}, "
                f"CPU per review {_x(result.ratio(lambda p: p.cpu_per_review, phase))}"
            )
        else:
            yield (
                f"  tessera/kueue: p50 {_x(result.ratio(lambda p: p.p(50), phase))}, "
                f"p99 {_x(result.ratio(lambda p: p.p(99), phase))}, "
                f"CPU per review {_x(result.ratio(lambda p: p.cpu_per_review, phase))}"
            )
    for name, pooled in result.saturation.items():
        for kind, count in sorted(pooled.errors.items()):
            yield f"  {name}: {count} failed at saturation: {kind}"
    for rate, phase in result.fixed.items():
        for name, pooled in phase.items():
            for kind, count in sorted(pooled.errors.items()):
                yield f"  {name}: {count} failed at {rate:,.0f}/s: {kind}"


class Bench:
    """The steps of one run: slices that alternate between the two servers."""

    def __init__(self, args: argparse.Namespace, endpoints: dict[str, Endpoint]) -> None:
        self.args = args
        self.endpoints = endpoints
        self.steps = 0

    def step(
        self, endpoint: Endpoint, template: ReviewTemplate, variant: Variant, rate: float, *,
        mode: str, seconds: float,
    ) -> StepResult:  # fmt: skip
        args = self.args
        saturating = rate >= SATURATION_RATE
        self.steps += 1
        spec = StepSpec(
            server=endpoint.name,
            mode=mode,
            port=endpoint.port,
            server_pid=endpoint.pid,
            ca=str(endpoint.ca),
            template=template,
            rate=rate,
            duration_s=seconds,
            connections=args.connections,
            core=args.client_core,
            nice=0,
            timeout_s=args.timeout,
            # at saturation the lag bounds the run: it falls behind at once, by design
            max_lag_s=seconds if saturating else args.max_lag,
            max_requests=STEP_INDEX_SPAN - args.connections,
            path=endpoint.path,
            server_name=endpoint.server_name,
            patch=endpoint.patches(variant),
            first_index=self.steps * STEP_INDEX_SPAN,
        )
        return run_step(spec)

    def alternate(
        self, templates: dict[str, ReviewTemplate], variant: Variant, rate: float, mode: str,
    ) -> dict[str, Pooled]:  # fmt: skip
        """``--duration`` seconds for each server, in slices that take turns (who goes
        first alternates too)."""
        pooled = {name: Pooled() for name in SERVERS}
        slices = max(1, math.ceil(self.args.duration / self.args.slice))
        seconds = self.args.duration / slices
        for n in range(slices):
            order = SERVERS if n % 2 == 0 else SERVERS[::-1]
            for name in order:
                endpoint = self.endpoints[name]
                step = self.step(
                    endpoint, templates[name], variant, rate, mode=mode, seconds=seconds
                )
                pooled[name].add(step)
        return pooled


def run_variant(
    bench: Bench, captured: dict[str, Any], variant: Variant, say: Callable[[str], None]
) -> VariantResult:
    args = bench.args
    review_body = captured if variant.suspended else unsuspended(captured)
    template = ReviewTemplate.of(review_body, variant.templates, renamed=variant.renamed)
    templates = dict.fromkeys(SERVERS, template)
    result = VariantResult(variant)
    for name, endpoint in bench.endpoints.items():
        uid = uid_prefix() + "f" * 12
        body = template.body(uid, 0)
        result.patches[name] = uvloop.run(
            _first_review(endpoint, body, uid, endpoint.patches(variant))
        )
    say(f"{variant.name}: " + "; ".join(f"{n} {_patch_text(p)}" for n, p in result.patches.items()))
    if args.warmup > 0:
        for endpoint in bench.endpoints.values():
            bench.step(
                endpoint, template, variant, SATURATION_RATE, mode="warm-up", seconds=args.warmup
            )
    result.saturation = bench.alternate(templates, variant, SATURATION_RATE, "saturation")
    say(
        f"{variant.name}: saturation "
        + ", ".join(f"{n} {p.rate:,.0f}/s" for n, p in result.saturation.items())
    )
    lower = min(p.rate for p in result.saturation.values())
    for load in args.loads:
        rate = round_rate(lower * load)
        result.fixed[rate] = bench.alternate(templates, variant, rate, "fixed")
        say(
            f"{variant.name}: {rate:,.0f}/s p99 "
            + ", ".join(f"{n} {_ms(p.p(99))}" for n, p in result.fixed[rate].items())
        )
    return result


def run(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> Report:
    started = clock.monotonic()
    available = os.sched_getaffinity(0)
    cores = {args.server_core, args.client_core, *args.kueue_cores}
    if not cores <= available or args.server_core == args.client_core:
        raise BenchError(
            f"need two distinct CPUs for --server-core/--client-core (and --kueue-cores "
            f"among this process's), this process may use {sorted(available)}"
        )
    variants = [v for v in VARIANTS if v.name in args.variants]
    captured = load_captured_review(args.captures)
    binaries, crds, release = _find_assets()
    os.sched_setaffinity(0, {args.client_core})  # the orchestrator only waits
    folder = Path(tempfile.mkdtemp(prefix="tessera-bench-kueue-"))
    try:
        with ExitStack() as stack:
            objects = kueue_valid(policy_objects(args.queues, args.seed))
            queues = sum(1 for o in objects if o["kind"] == "LocalQueue")
            report = Report(args, queues)
            report.load["start"] = os.getloadavg()
            say("starting etcd, kube-apiserver and Kueue v0.17.0 ...")
            kueue_cpus = frozenset(args.kueue_cores)
            cluster = bring_up_kueue(binaries, crds, release, folder, clock, kueue_cpus)
            stack.callback(cluster.stop)
            _install_policy(cluster, folder, objects)
            say(f"Kueue ready; policy of {queues:,} LocalQueues applied")
            policy_path = folder / "policy.yaml"
            write_policy(policy_path, objects)
            make_certs(folder / "certs")
            ca = folder / "certs" / "ca.crt"
            tessera = Server("tessera", "webhook", [], args.server_core, folder / "webhook.log")
            tessera.args = [
                "--host", "127.0.0.1", "--port", str(tessera.port),
                "--tls-cert", str(folder / "certs" / "webhook.crt"),
                "--tls-key", str(folder / "certs" / "webhook.key"),
                "--policy-file", str(policy_path), "--log-level", "WARNING",
            ]  # fmt: skip
            tessera.start(stack)
            uvloop.run(wait_ready(tessera, ca, clock, deadline_s=60.0, poll_s=0.1))
            kueue_pid = cluster.kueue.pid
            assert kueue_pid is not None
            report.endpoints = {
                "tessera": Endpoint(
                    "tessera", tessera.port, tessera.pid, ca, SERVER_NAME, MUTATE_PATH,
                    tessera.command, (args.server_core,),
                ),
                "kueue": Endpoint(
                    "kueue", cluster.webhook_port, kueue_pid, cluster.ca_file,
                    KUEUE_SERVER_NAME, KUEUE_PATH,
                    f"{cluster.kueue.command[0]} --config=... (GOMAXPROCS from its CPUs)",
                    tuple(sorted(kueue_cpus)),
                ),
            }  # fmt: skip
            bench = Bench(args, report.endpoints)
            for variant in variants:
                report.variants.append(run_variant(bench, captured, variant, say))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.load["end"] = os.getloadavg()
    report.wall_s = clock.monotonic() - started
    return report


# ---------------------------------------------------------------- main


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: fractions between 0 and 1, e.g. 0.3,0.6")
    return values


def _cores(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: CPU numbers, e.g. 0 or 0,1") from None


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    known = [v.name for v in VARIANTS]
    if not names or not set(names) <= set(known):
        raise argparse.ArgumentTypeError(f"{text!r}: some of {', '.join(known)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest bench-webhook --against kueue",
        description="Tessera's webhook and Kueue v0.17.0's Job webhook, the same reviews "
        "to both, alternating, open loop over TLS; ratios Tessera/Kueue.",
        epilog="examples:\n"
        "  python -m loadtest bench-webhook --against kueue\n"
        "  python -m loadtest bench-webhook --against kueue --duration 20 --json k.json\n"
        "  python -m loadtest bench-webhook --against kueue --variants distinct "
        "--kueue-cores 0,1\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--against", choices=["kueue"], required=True, help="the other webhook (kueue)")
    add("--duration", type=float, default=20.0, help="seconds per server and phase (20)")
    add("--slice", type=float, default=5.0, help="seconds per turn of a server (5)")
    add("--warmup", type=float, default=2.0, help="warm-up per server and variant, s (2)")
    add(
        "--loads",
        type=_fractions,
        default=(0.3, 0.6),
        help="fixed rates as fractions of the lower saturation throughput (0.3,0.6)",
    )
    add(
        "--variants",
        type=_variants,
        default=tuple(v.name for v in VARIANTS),
        help="which of " + ", ".join(v.name for v in VARIANTS) + " (all)",
    )
    add("--queues", type=int, default=1000, help="LocalQueues in the policy (1000)")
    add("--seed", type=int, default=1, help="seed of the generated policy")
    add("--captures", type=Path, default=DEFAULT_CAPTURES, help="folder of the wire captures")
    add("--connections", type=int, default=8, help="keep-alive TLS connections (8)")
    add("--timeout", type=float, default=5.0, help="request timeout, seconds (5)")
    add("--max-lag", type=float, default=1.0, help="stop a fixed-rate slice this far behind, s")
    add("--server-core", type=int, default=0, help="CPU of Tessera's webhook (0)")
    add(
        "--kueue-cores",
        type=_cores,
        default=None,
        help="CPUs of Kueue's manager (default: --server-core, as the webhook has one)",
    )
    add("--client-core", type=int, default=1, help="CPU of the load generator (1)")
    add("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.kueue_cores is None:
        args.kueue_cores = (args.server_core,)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_report("python -m loadtest bench-webhook --against kueue", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
