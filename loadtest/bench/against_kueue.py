"""Tessera's webhook side by side with Kueue's: the same Job AdmissionReviews to both, in
one run (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts a control plane and
servers, prints a table). Must not be imported by the servers or run by pytest, except
by the e2e test that runs the command.

``python -m loadtest bench-webhook --against kueue [--duration 20 --json F]``:

1. brings up etcd, kube-apiserver and the real Kueue manager (the pinned release of
   ``make e2e-assets``; ``loadtest.stack.cluster.bring_up_kueue``), creates the
   namespaces and applies to it the queue policy that ``webhook_policy`` generates (the
   captured Job's ``team-nlp/team-nlp-queue`` among them), and starts ``python -m
   webhook`` with the same policy as a file;
2. runs both servers on the same CPU (``--server-core``; Kueue's manager is pinned before
   it starts, so Go sizes ``GOMAXPROCS`` to it) and the load generator on another
   (``--client-core``), as ``bench-webhook`` does: the webhook is one process on one
   core, so Kueue gets one core too (``--kueue-cores 0,1`` gives it more);
3. for each variant of the captured Job (``VARIANTS``), sends its reviews over keep-alive
   TLS connections that verify each server's CA, to Kueue's ``/mutate-batch-v1-job`` and
   to Tessera's ``/mutate``, with the open-loop generator of ``bench-webhook``
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
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import uvloop
import yaml

from cluster import jsonio
from cluster.clock import Clock
from loadtest.bench.against_kueue_results import (
    VARIANTS,
    Endpoint,
    Pooled,
    Report,
    Variant,
    VariantResult,
    ms,
    patch_text,
    unsuspended,
)
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
from loadtest.measure.pinned import SERVER_NAME, BenchError, Settled, make_certs, wait_settled
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
STEP_INDEX_SPAN: Final = 2**32
"""Each step sends template numbers from its own range of this size."""
HOW_TO_GET: Final = (
    "the Kubernetes binaries and Kueue v0.17.0 are not built: run `make e2e-assets` "
    "(needs Go >= 1.26; see tests/e2e/README.md), then run this again"
)
SERVERS: Final = ("tessera", "kueue")


# ---------------------------------------------------------------- the servers


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
    """The policy as Kueue's validation takes it: ``webhook_policy`` leaves a flavor's
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
    say(f"{variant.name}: " + "; ".join(f"{n} {patch_text(p)}" for n, p in result.patches.items()))
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
            + ", ".join(f"{n} {ms(p.p(99))}" for n, p in result.fixed[rate].items())
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
            tessera = _start_tessera(args, folder, objects, stack, clock)
            report.endpoints = _endpoints(args, tessera, folder / "certs" / "ca.crt", cluster)
            report.settled = _settle(cluster, report.endpoints, clock, say)
            bench = Bench(args, report.endpoints)
            for variant in variants:
                report.variants.append(run_variant(bench, captured, variant, say))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.load["end"] = os.getloadavg()
    report.wall_s = clock.monotonic() - started
    return report


def _start_tessera(
    args: argparse.Namespace,
    folder: Path,
    objects: list[dict[str, Any]],
    stack: ExitStack,
    clock: Clock,
) -> Server:
    """Tessera's webhook with the same policy as a file, ready to review."""
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
    return tessera


SETTLING: Final = ("etcd", "kube-apiserver", "kube-controller-manager")
"""The control plane's processes that must be quiet, besides both servers, before the
first phase."""


def _settle(
    cluster: KueueOnly,
    endpoints: dict[str, Endpoint],
    clock: Clock,
    say: Callable[[str], None],
) -> Settled:
    """Wait for Kueue to finish reconciling the policy just applied (and the control
    plane its writes), so that its startup work is in neither server's figures."""
    pids = [e.pid for e in endpoints.values()]
    pids += [p for p in map(cluster.plane.pid, SETTLING) if p is not None]
    settled = wait_settled(pids, clock, time.sleep)
    use = f"{100 * settled.cores:.1f} % of a core"
    if settled.settled:
        say(f"servers and control plane settled after {settled.waited_s:.0f} s ({use})")
    else:
        say(f"still busy after {settled.waited_s:.0f} s ({use}); measuring anyway")
    return settled


def _endpoints(
    args: argparse.Namespace, tessera: Server, ca: Path, cluster: KueueOnly
) -> dict[str, Endpoint]:
    kueue_pid = cluster.kueue.pid
    assert kueue_pid is not None
    return {
        "tessera": Endpoint(
            "tessera", tessera.port, tessera.pid, ca, SERVER_NAME, MUTATE_PATH,
            tessera.command, (args.server_core,),
        ),
        "kueue": Endpoint(
            "kueue", cluster.webhook_port, kueue_pid, cluster.ca_file,
            KUEUE_SERVER_NAME, KUEUE_PATH,
            f"{cluster.kueue.command[0]} --config=... (GOMAXPROCS from its CPUs)",
            tuple(sorted(args.kueue_cores)),
        ),
    }  # fmt: skip


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
