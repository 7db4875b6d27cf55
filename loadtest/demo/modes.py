"""``make demo`` and the load-test modes: run a scenario, print it, write the reports.

Layer: ROOT. Chooses the run's shape for each mode (``demo``: 64 HGX nodes, the three
teams' queues, a mixed stream for about twenty seconds; ``latency``: a bigger fleet at a
target job rate; ``soak``: a long steady run watching memory), runs it through
``scenario``, prints the summary and writes ``<name>.json`` and ``<name>.html``.
``execute_real`` (``demo --real``) runs the same kind of stream on the real stack instead
(``loadtest.demo.real``), in one topology mode or in both, each on a fresh stack, and
prints the two side by side. Must not read the environment (``__main__`` does) or decide
anything about the cluster.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvloop

from cluster import jsonio
from cluster.clock import Clock
from loadtest.demo import real as real_demo
from loadtest.inputs.fleet import FleetSpec, StreamSpec
from loadtest.report import page, summary, terminal
from loadtest.report import real as real_report
from loadtest.sim import kueue, scenario
from loadtest.sim.cluster_sim import ClusterSim
from loadtest.stack.cluster import E2ECluster, bring_up

Say = Callable[[str], None]


def demo_spec(*, short: bool = False, seed: int = 1) -> scenario.RunSpec:
    if short:
        # CI: a small fleet, a few seconds of jobs, quick pods; same flow end to end.
        return scenario.RunSpec(
            fleet=FleetSpec(nodes=16),
            stream=StreamSpec(rate=15.0, duration_s=4.0, median_run_s=0.8, max_run_s=3.0),
            drain_s=10.0,
            seed=seed,
        )
    return scenario.RunSpec(
        fleet=FleetSpec(nodes=64),
        stream=StreamSpec(rate=40.0, duration_s=20.0, median_run_s=4.0, max_run_s=15.0),
        drain_s=20.0,
        seed=seed,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    data: dict[str, Any]
    json_path: Path
    html_path: Path

    @property
    def ok(self) -> bool:
        return bool(self.data["checks"]["ok"]) and not self.data["errors_fatal"]


def _progress(say_live: Callable[[str], None]) -> Callable[[ClusterSim], None]:
    def show(sim: ClusterSim) -> None:
        r = sim.result
        jobs = len(r.jobs)
        bound = sum(1 for p in r.pods.values() if p.bound_s is not None and not p.ended)
        pending = sum(1 for p in r.pods.values() if p.bound_s is None and not p.ended)
        gpus = r.samples[-1].gpus_allocated if r.samples else 0.0
        total = max(r.gpus_total, 1)
        filled = int(30 * gpus / total)
        bar = "#" * filled + "." * (30 - filled)
        say_live(
            f"{sim.now_s():6.1f} s  jobs {jobs:>5}/{len(sim.jobs_in)}  "
            f"waiting {len(sim.pending):>4}  "
            f"running {bound:>4}  pending {pending:>4}  GPUs [{bar}] {100 * gpus / total:5.1f}%"
        )

    return show


def quota_nominal_gpus(prepared: scenario.Prepared) -> int:
    """The whole GPUs all ClusterQueues may hold together (shares as milli / 1000)."""
    total_milli = 0
    for obj in prepared.policy:
        if obj.get("kind") != "ClusterQueue":
            continue
        for group in obj["spec"].get("resourceGroups", []):
            for flavor in group.get("flavors", []):
                for res in flavor.get("resources", []):
                    if res["name"] == "nvidia.com/gpu":
                        total_milli += 1000 * int(str(res.get("nominalQuota", 0)))
                    elif res["name"] == "tessera.dev/gpu-milli":
                        total_milli += int(str(res.get("nominalQuota", 0)))
    return total_milli // 1000


def execute(
    name: str,
    spec: scenario.RunSpec,
    out_dir: Path,
    *,
    clock: Clock,
    say: Say,
    live: Callable[[str], None] | None = None,
) -> Outcome:
    """Run one scenario, print its summary, write ``out_dir/<name>.json|.html``."""
    fleet = f"{spec.fleet.nodes} HGX nodes"
    if spec.trace is not None:
        fleet = f"the {spec.trace} trace"
    elif spec.node_file is not None:
        limit = f" (first {spec.node_limit})" if spec.node_limit else ""
        fleet = f"the {spec.node_file} nodes{limit} (synthetic racks)"
    say(
        f"starting: webhook (TLS, fresh certificates) and extender, {fleet}, "
        f"~{spec.stream.rate * spec.stream.duration_s:.0f} jobs over {spec.stream.duration_s:.0f} s"
        if spec.remote is None
        else f"targets: {spec.remote.webhook_url} and {spec.remote.extender_url}"
    )
    began = clock.monotonic()
    progress = _progress(live) if live is not None else None
    result, prepared = uvloop.run(scenario.run(spec, clock, progress))
    if live is not None:
        live("")
    nominal = quota_nominal_gpus(prepared)
    meta = {
        "mode": name,
        "nodes": len(prepared.nodes),
        "trace": spec.trace,
        "node_file": spec.node_file,
        "node_limit": spec.node_limit,
        "rate_jobs_per_s": spec.stream.rate,
        "arrivals_s": spec.stream.duration_s,
        "seed": spec.seed,
        "quota_scale": prepared.quota_scale,
        "quota_nominal_gpus": nominal,
        "remote": spec.remote is not None,
        "wall_s": clock.monotonic() - began,
    }
    data = summary.to_json(result, meta, nominal)
    data["errors_fatal"] = sum(result.errors.values())
    data["capacity"] = summary.capacity_json(result, kueue.setup_from_objects(prepared.policy))
    title = f"Tessera load test: {name}, {result.nodes} nodes, {len(result.jobs)} jobs"
    return _publish(
        data,
        terminal.summary_lines(result, data),
        page.html_page(result, data, title),
        out_dir / name,
        say=say,
        took_s=clock.monotonic() - began,
    )


def _publish(
    data: dict[str, Any],
    summary: Iterable[str],
    html: str,
    stem: Path,
    *,
    say: Say,
    took_s: float,
) -> Outcome:
    """Print a run's summary and write ``<stem>.json`` and ``<stem>.html``."""
    for line in summary:
        say(line)
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, html_path = stem.with_name(f"{stem.name}.json"), stem.with_name(f"{stem.name}.html")
    json_path.write_bytes(jsonio.dumps(data))
    html_path.write_text(html, encoding="utf-8")
    say(f"reports: {json_path} {html_path}  ({took_s:.1f} s)")
    return Outcome(data, json_path, html_path)


def live_line(stream: Any = sys.stderr) -> Callable[[str], None] | None:
    """A progress line rewritten in place, only on a terminal."""
    if not stream.isatty():
        return None

    def show(text: str) -> None:
        stream.write("\r" + text.ljust(110)[:110] + ("\n" if not text else ""))
        stream.flush()

    return show


def with_stream(spec: scenario.RunSpec, **changes: Any) -> scenario.RunSpec:
    return replace(spec, stream=replace(spec.stream, **changes))


# ---------------------------------------------------------------- demo --real


@dataclass(frozen=True, slots=True)
class Assets:
    """The pinned control plane, CRDs, Kueue and JobSet (``make e2e-assets``)."""

    binaries: Path
    crds: Path
    kueue: Path
    jobset: Path


def run_real_on(
    cluster: E2ECluster,
    spec: real_demo.RealSpec,
    out_dir: Path,
    *,
    clock: Clock,
    say: Say,
    live: Callable[[str], None] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Outcome:
    """The stream on a running stack (the CLI's own, or the e2e suite's), which it leaves
    as it found it; prints the summary, writes ``out_dir/demo-real-<topology>.json|.html``."""
    name = f"demo-real-{spec.topology}"
    began = clock.monotonic()
    run = real_demo.RealDemo(
        cluster, spec, clock, quota_nominal_gpus=quota_nominal_gpus, progress=live
    )
    try:
        run.setup()
        say(
            f"{run.result.nodes} fake HGX nodes, {len(run.prepared.jobs)} jobs over "
            f"{spec.stream.duration_s:.0f} s ({real_report.MODE_NAMES[spec.topology]})"
        )
        result = run.drive()
    finally:
        if live is not None:
            live("")
        run.cleanup()
    data = real_report.to_json(
        result,
        {
            "mode": name,
            "nodes": result.nodes,
            "rate_jobs_per_s": spec.stream.rate,
            "arrivals_s": spec.stream.duration_s,
            "seed": spec.seed,
            "quota_scale": run.prepared.quota_scale,
            "quota_nominal_gpus": result.quota_nominal_gpus,
            "wall_s": clock.monotonic() - began,
            **(meta or {}),
        },
    )
    data["errors_fatal"] = 0
    title = f"Tessera on the real stack: {name}, {result.nodes} nodes, {len(result.jobs)} jobs"
    return _publish(
        data,
        real_report.summary_lines(result, data),
        real_report.html_page(result, data, title),
        out_dir / name,
        say=say,
        took_s=clock.monotonic() - began,
    )


def _one_real(
    spec: real_demo.RealSpec,
    assets: Assets,
    out_dir: Path,
    workdir: Path,
    *,
    clock: Clock,
    say: Say,
    live: Callable[[str], None] | None,
    keep: bool,
) -> Outcome:
    say(
        f"starting the real stack for demo-real-{spec.topology} (etcd, kube-apiserver, "
        "kube-controller-manager, Kueue, Tessera's webhook and extender, kube-scheduler)"
    )
    began = clock.monotonic()
    # No nodes of the stack's own: the demo brings its fleet and the kubelet that ends
    # each pod after its job's run time.
    cluster = bring_up(
        assets.binaries,
        assets.crds,
        assets.kueue,
        assets.jobset,
        workdir=workdir / spec.topology,
        clock=clock,
        fleet=(),
    )
    atexit.register(cluster.stop)
    try:
        up_s = clock.monotonic() - began
        say(f"stack up in {up_s:.0f} s")
        logs = str(workdir / spec.topology / "logs") if keep else None
        return run_real_on(
            cluster,
            spec,
            out_dir,
            clock=clock,
            say=say,
            live=live,
            meta={"startup_s": up_s, "logs": logs},
        )
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)


def execute_real(
    specs: Sequence[real_demo.RealSpec],
    assets: Assets,
    out_dir: Path,
    *,
    clock: Clock,
    say: Say,
    live: Callable[[str], None] | None = None,
    keep_dir: Path | None = None,
) -> list[Outcome]:
    """Each spec on a fresh stack (its own control plane, so one mode's leftovers cannot
    touch the other's figures); with more than one, their figures side by side, also in
    ``out_dir/demo-real-compare.json``."""
    workdir = keep_dir or Path(tempfile.mkdtemp(prefix="tessera-demo-real-"))
    outcomes = []
    try:
        for spec in specs:
            outcomes.append(
                _one_real(
                    spec,
                    assets,
                    out_dir,
                    workdir,
                    clock=clock,
                    say=say,
                    live=live,
                    keep=keep_dir is not None,
                )
            )
            say("")
    finally:
        if keep_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if len(outcomes) > 1:
        runs = {o.data["meta"]["topology"]: o.data for o in outcomes}
        for line in real_report.compare_lines(runs):
            say(line)
        path = out_dir / "demo-real-compare.json"
        path.write_bytes(jsonio.dumps({"runs": runs}))
        say(f"side by side: {path}")
    return outcomes
