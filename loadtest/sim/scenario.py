"""One load-test run, assembled: inputs, servers, the simulated cluster.

Layer: ROOT (wires the pieces; the CLI in ``__main__`` fills ``RunSpec`` from flags).
Builds the fleet and the job stream, loads the teams' Kueue objects from
``manifests/examples`` (quotas scaled to the fleet), starts the ``MiniApiServer`` and
both servers (or connects to remote ones), runs ``ClusterSim`` and returns its result.
Must not read the environment or print: ``progress`` and the caller do the talking.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster.clock import Clock
from cluster.files import load_objects
from cluster.kube import KubeConfig
from loadtest.inputs import fleet as fleet_mod
from loadtest.inputs import node_files, trace_input, traces
from loadtest.measure.pinned import ROOT
from loadtest.sim import verb_rate
from loadtest.sim.apiserver import NODES, MiniApiServer
from loadtest.sim.cluster_sim import ClusterSim
from loadtest.sim.records import SimResult
from loadtest.sim.remote_pods import RemoteClusterError, RemotePods
from loadtest.sim.targets import Targets, local_servers, remote, write_objects

EXAMPLES_DIR = ROOT / "manifests" / "examples"
POLICY_FILES = (
    "flavors.yaml",
    "topology.yaml",
    "priority-classes.yaml",
    "cluster-queues.yaml",
    "local-queues.yaml",
)
NODE_FILES = {
    "spot-v2026": traces.read_spot_nodes,
    "openb": traces.read_openb_nodes,
}
"""``RunSpec.node_file`` → the reader of that node list in the data folder."""


@dataclass(frozen=True, slots=True)
class Remote:
    """A real deployment. ``kubeconfig`` reaches the kube-apiserver its extender
    watches and binds through: the run's pods are created there (in ``namespace``,
    which the load test owns) and deleted when they end, or their GPUs would never be
    freed. Without it a run is refused."""

    webhook_url: str
    extender_url: str
    ca: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    kubeconfig: Path | None = None
    namespace: str = "tessera-loadtest"


class RemoteRefused(ValueError):
    """A remote run that would leave GPUs allocated in the deployment."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    fleet: fleet_mod.FleetSpec = field(default_factory=fleet_mod.FleetSpec)
    stream: fleet_mod.StreamSpec = field(default_factory=fleet_mod.StreamSpec)
    quota_scale: int | None = None
    """None: scale the example quotas to the fleet's GPUs."""
    drain_s: float = 30.0
    extender_weight: int = 5
    seed: int = 1
    remote: Remote | None = None
    keep_dir: Path | None = None
    """Where server logs, certificates and the policy go (default: a temporary folder)."""
    node_file: str | None = None
    """A key of ``NODE_FILES``: that real node list from ``data_dir`` instead of the HGX
    fleet, under the synthetic stream (``loadtest.inputs.node_files`` says how)."""
    node_limit: int | None = None
    """With ``node_file``: its first this many nodes (file order)."""
    trace: str | None = None
    """``openb-<variant>`` (e.g. ``openb-default``): nodes and pods from the Alibaba openb
    trace in ``data_dir`` instead of the HGX fleet and the synthetic stream."""
    data_dir: Path | None = None
    verb_rate: float | None = None
    """After the cluster run: /mutate, /filter and /prioritize alone at this rate each."""
    verb_duration_s: float = 10.0


def example_policy() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for name in POLICY_FILES:
        objects.extend(load_objects(EXAMPLES_DIR / name))
    return objects


def default_scale(policy: list[dict[str, Any]], gpus: int) -> int:
    """The largest whole factor that keeps the examples' nominal GPU quota within the
    fleet's GPUs (at least 1)."""
    nominal = 0
    for obj in policy:
        if obj.get("kind") != "ClusterQueue":
            continue
        for group in obj["spec"].get("resourceGroups", []):
            for flavor in group.get("flavors", []):
                for res in flavor.get("resources", []):
                    if res["name"] == "nvidia.com/gpu":
                        nominal += int(str(res.get("nominalQuota", 0)))
    return max(1, gpus // max(nominal, 1))


@dataclass(slots=True)
class Prepared:
    nodes: list[dict[str, Any]]
    policy: list[dict[str, Any]]
    jobs: list[fleet_mod.JobSpec]
    quota_scale: int


def prepare(spec: RunSpec, now: datetime) -> Prepared:
    rng = random.Random(spec.seed)
    if spec.trace is not None:
        return _prepare_trace(spec, rng)
    if spec.node_file is not None:
        return _prepare_node_file(spec, rng)
    nodes = fleet_mod.hgx_fleet(spec.fleet, now, rng)
    policy = example_policy()
    gpus = 8 * len(nodes)
    scale = spec.quota_scale or default_scale(policy, gpus)
    policy = fleet_mod.scale_quotas(policy, scale)
    jobs = fleet_mod.job_stream(spec.stream, rng)
    return Prepared(nodes, policy, jobs, scale)


async def run(
    spec: RunSpec,
    clock: Clock,
    progress: Callable[[ClusterSim], None] | None = None,
) -> tuple[SimResult, Prepared]:
    if spec.remote is not None and spec.remote.kubeconfig is None:
        raise RemoteRefused(
            "a remote run needs the deployment's kubeconfig: without it the pods the "
            "extender binds do not exist in its cluster, and the GPUs of pods that end "
            "are never freed"
        )
    prepared = prepare(spec, clock.now())
    folder = spec.keep_dir or Path(tempfile.mkdtemp(prefix="tessera-loadtest-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        write_objects(folder / "nodes.json", prepared.nodes)
        async with MiniApiServer() as api, contextlib.AsyncExitStack() as stack:
            remote_pods = await _remote_pods(spec, prepared, stack)
            for node in prepared.nodes:
                api.put(NODES, node)
            async with _targets(spec, prepared, api, folder, clock) as targets:
                sim = ClusterSim(
                    targets,
                    api,
                    prepared.nodes,
                    prepared.policy,
                    prepared.jobs,
                    clock=clock,
                    extender_weight=spec.extender_weight,
                    drain_s=spec.drain_s,
                    seed=spec.seed,
                    progress=progress,
                    remote_pods=remote_pods,
                )
                result = await sim.run()
                if spec.verb_rate:
                    await _each_verb_alone(
                        spec.verb_rate, spec.verb_duration_s, sim, targets, result
                    )
        return result, prepared
    finally:
        if spec.keep_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


async def _remote_pods(
    spec: RunSpec, prepared: Prepared, stack: contextlib.AsyncExitStack
) -> RemotePods | None:
    """A remote run's pods in the deployment's cluster, once its nodes are known there."""
    if spec.remote is None or spec.remote.kubeconfig is None:
        return None
    config = await KubeConfig.from_kubeconfig(spec.remote.kubeconfig)
    remote_pods = await stack.enter_async_context(RemotePods(config, spec.remote.namespace))
    names = [n["metadata"]["name"] for n in prepared.nodes]
    missing = await remote_pods.missing_nodes(names)
    if missing:
        raise RemoteClusterError(
            f"{len(missing)} of the run's {len(names)} nodes are not in the "
            f"cluster (e.g. {', '.join(missing[:3])}): the load test schedules "
            "over its own node list, so the cluster must have those nodes "
            "(see --keep's nodes.json)"
        )
    return remote_pods


def _targets(
    spec: RunSpec, prepared: Prepared, api: MiniApiServer, folder: Path, clock: Clock
) -> AbstractAsyncContextManager[Targets]:
    """Both servers started here, watching ``api``, or the remote deployment's."""
    if spec.remote is None:
        return local_servers(
            folder,
            prepared.policy,
            api.kubeconfig(folder),
            ["--topology-levels", fleet_mod.TOPOLOGY_LEVELS, "--assume-ttl", "120"],
            clock,
        )
    return remote(
        spec.remote.webhook_url,
        spec.remote.extender_url,
        clock,
        ca=spec.remote.ca,
        client_cert=spec.remote.client_cert,
        client_key=spec.remote.client_key,
    )


async def _each_verb_alone(
    rate: float, duration_s: float, sim: ClusterSim, targets: Targets, result: SimResult
) -> None:
    """After the cluster run, each verb alone at ``rate`` per second (latency mode)."""
    # as many candidates as kube-scheduler sends for one pod at this scale
    asked = list(sim.rooms)[: sim.nodes_to_find]
    runs = await verb_rate.run_verbs(
        targets.webhook.url,
        targets.extender.url,
        asked,
        sim.clock,
        webhook_ssl=targets.webhook.tls,
        extender_ssl=targets.extender.tls,
        rate=rate,
        duration_s=duration_s,
    )
    result.open_loop = {r.verb: r.to_json() for r in runs}
    for target in (targets.webhook, targets.extender):
        target.note_rss(sim.now_s())
    result.rss = {t.name: list(t.rss_samples) for t in (targets.webhook, targets.extender)}


def _prepare_trace(spec: RunSpec, rng: random.Random) -> Prepared:
    """``TraceMissing`` (a ``FileNotFoundError`` naming the file) without the data."""
    dataset, _, variant = (spec.trace or "").partition("-")
    if dataset != "openb" or spec.data_dir is None:
        raise ValueError(f"unknown trace {spec.trace!r}: use openb-<variant>, e.g. openb-default")
    trace_nodes = traces.read_openb_nodes(spec.data_dir)
    trace_pods = traces.read_openb_pods(spec.data_dir, variant or "default")
    priorities = [o for o in example_policy() if o.get("kind") == "WorkloadPriorityClass"]
    return Prepared(
        trace_input.trace_nodes(trace_nodes),
        trace_input.trace_policy(trace_nodes, priorities),
        trace_input.trace_jobs(trace_pods, spec.stream, rng),
        1,
    )


def _prepare_node_file(spec: RunSpec, rng: random.Random) -> Prepared:
    """``TraceMissing`` without the data; ``ValueError`` for an unknown node file."""
    reader = NODE_FILES.get(spec.node_file or "")
    if reader is None or spec.data_dir is None:
        raise ValueError(
            f"unknown node file {spec.node_file!r}: use one of {', '.join(NODE_FILES)}"
        )
    rows = reader(spec.data_dir)
    if spec.node_limit is not None:
        rows = rows[: spec.node_limit]
    policy = node_files.fleet_policy(rows, example_policy())
    scale = spec.quota_scale or 1
    if scale != 1:
        policy = fleet_mod.scale_quotas(policy, scale)
    jobs = fleet_mod.job_stream(spec.stream, rng)
    return Prepared(node_files.fleet_nodes(rows), policy, jobs, scale)
