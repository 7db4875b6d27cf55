"""The simulated cluster's inputs: an HGX fleet, the teams' Kueue objects, a job stream.

Layer: PURE. Builds plain dicts shaped like the API's JSON (Nodes, Kueue objects, Jobs)
from a seeded ``random.Random`` and the example manifests' objects; no I/O, no clock
(times come in as arguments), no servers. Must not decide anything the servers decide.

The fleet follows the example ResourceFlavors (``manifests/examples/flavors.yaml``):
reserved H100 nodes, spot H100 nodes with the spot taint, and A100 nodes, racked four to
a rack and four racks to a block, two NVLink islands of four GPUs per node, a few
unhealthy GPUs and one node with a maintenance window. The example ClusterQueues hold
96 GPUs of nominal quota in all; ``scale_quotas`` multiplies them so that the quota
matches the fleet (the demo's 64 nodes hold 512 GPUs, quotas x5 give 480).

The job stream's shape follows published GPU-cluster trace statistics (Alibaba PAI /
openb, Philly): most jobs take one GPU, a minority are multi-GPU or gangs, a few take a
share of one GPU, and durations are long-tailed (log-normal).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from cluster import labels

Obj = dict[str, Any]

CAPACITY_LABEL: Final = "cloud.example.com/capacity"
SPOT_TAINT: Final = "cloud.example.com/spot"
BLOCK_LABEL: Final = "example.com/block"
RACK_LABEL: Final = "example.com/rack"
TOPOLOGY_LEVELS: Final = f"block={BLOCK_LABEL},rack={RACK_LABEL},hostname={labels.HOSTNAME}"
"""The extender's ``--topology-levels`` for this fleet (the example Topology's labels)."""
H100: Final = "NVIDIA-H100-80GB-HBM3"
A100: Final = "NVIDIA-A100-SXM4-80GB"
NODES_PER_RACK: Final = 4
RACKS_PER_BLOCK: Final = 4


@dataclass(frozen=True, slots=True)
class FleetSpec:
    nodes: int = 64
    reserved_share: float = 0.5
    spot_share: float = 0.3
    """The rest are A100 nodes."""
    unhealthy_gpus: int = 3
    drain_in: timedelta = timedelta(hours=6)
    """The maintenance window starts this long after ``now``: jobs with a longer time
    limit (the nlp queue's default 8 h) may not start on that node."""


def hgx_fleet(spec: FleetSpec, now: datetime, rng: random.Random) -> list[Obj]:
    """Node objects as a kubelet with the device plugin and GFD would register them."""
    reserved = round(spec.nodes * spec.reserved_share)
    spot = round(spec.nodes * spec.spot_share)
    unhealthy = set(rng.sample(range(spec.nodes), min(spec.unhealthy_gpus, spec.nodes)))
    drain_node = reserved - 1 if reserved else -1
    nodes: list[Obj] = []
    for i in range(spec.nodes):
        kind = "reserved" if i < reserved else "spot" if i < reserved + spot else "a100"
        name = f"hgx-{i:03d}"
        rack = i // NODES_PER_RACK
        node_labels = {
            labels.HOSTNAME: name,
            labels.GFD_PRODUCT: A100 if kind == "a100" else H100,
            labels.GFD_MEMORY: "81559",
            BLOCK_LABEL: f"block-{rack // RACKS_PER_BLOCK}",
            RACK_LABEL: f"rack-{rack:02d}",
        }
        if kind != "a100":
            node_labels[CAPACITY_LABEL] = kind
        annotations = {labels.NVLINK_ISLANDS: "0-3,4-7"}
        if i in unhealthy:
            annotations[labels.UNHEALTHY_GPUS] = str(rng.randrange(8))
        if i == drain_node:
            when = (now + spec.drain_in).replace(microsecond=0)
            annotations[labels.DRAIN_AFTER] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        allocatable = {
            "cpu": "224",
            "memory": "2048Gi",
            "pods": "110",
            labels.GPU_RESOURCE: "8",
        }
        spec_part: Obj = {}
        if kind == "spot":
            spec_part["taints"] = [{"key": SPOT_TAINT, "value": "true", "effect": "NoSchedule"}]
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
                "spec": spec_part,
                "status": {"capacity": dict(allocatable), "allocatable": allocatable},
            }
        )
    return nodes


def scale_quotas(objects: Sequence[Obj], factor: int) -> list[Obj]:
    """The same Kueue objects with every GPU quota (nominal, borrowing, lending limit)
    multiplied by ``factor``; CPU and memory quotas are left alone (the fleet has
    plenty), and so are the queues' ``max-gpus-per-job`` annotations."""
    scaled = copy.deepcopy(list(objects))
    gpu_resources = {labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE}
    for obj in scaled:
        if obj.get("kind") != "ClusterQueue":
            continue
        for group in obj.get("spec", {}).get("resourceGroups", []):
            for flavor in group.get("flavors", []):
                for resource in flavor.get("resources", []):
                    if resource.get("name") not in gpu_resources:
                        continue
                    for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
                        if key in resource:
                            resource[key] = str(int(str(resource[key])) * factor)
    return scaled


# ---------------------------------------------------------------- the job stream


@dataclass(frozen=True, slots=True)
class Team:
    namespace: str
    queue: str
    weight: float
    gang_ok: bool
    """Whether this team runs gangs (the ones with big reserved quota do)."""
    share_ok: bool
    """Whether this team runs GPU shares (the ones with a milli quota do)."""


TEAMS: Final = (
    Team("team-nlp", "team-nlp-queue", 0.4, gang_ok=True, share_ok=False),
    Team("team-cv", "team-cv-queue", 0.3, gang_ok=True, share_ok=True),
    Team("team-research", "team-research-queue", 0.3, gang_ok=False, share_ok=True),
)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to create: its object, when, and how long its pods run (seconds of the
    run's wall clock, i.e. after time compression)."""

    at_s: float
    job: Obj
    run_s: float
    kind: str
    """``1-gpu``, ``multi-gpu``, ``gang``, ``share`` or ``bad-*`` (expected denials)."""

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class StreamSpec:
    rate: float = 30.0
    """Jobs created per second (Poisson arrivals)."""
    duration_s: float = 20.0
    median_run_s: float = 3.0
    run_sigma: float = 1.0
    """Log-normal shape of run times: sigma 1 puts the mean at 1.65x the median and
    one job in a hundred above 10x the median."""
    max_run_s: float = 20.0
    bad_jobs: int = 4
    """Jobs the webhook must deny, spread over the stream (wrong queue, unknown priority
    class, more GPUs than the queue may ever have, a GPU product no flavor offers)."""


def _container(gpus: int, milli: int) -> Obj:
    limits: Obj = {"cpu": str(max(2, 8 * max(gpus, 1))), "memory": f"{64 * max(gpus, 1)}Gi"}
    if milli:
        limits[labels.GPU_MILLI_RESOURCE] = str(milli)
    else:
        limits[labels.GPU_RESOURCE] = str(gpus)
    return {"name": "main", "image": "registry.example/train:1.0", "resources": {"limits": limits}}


def job_object(
    name: str,
    team: Team,
    *,
    pods: int = 1,
    gpus: int = 1,
    milli: int = 0,
    topology: str | None = None,
    queue: str | None = None,
    priority: str | None = None,
    product: str | None = None,
) -> Obj:
    """A ``batch/v1`` Job as a user writes it (no suspend, no affinity: the webhook adds them)."""
    job_labels = {labels.QUEUE_NAME: queue or team.queue}
    if priority is not None:
        job_labels[labels.PRIORITY_CLASS] = priority
    annotations: Obj = {}
    if topology is not None:
        annotations[labels.TOPOLOGY] = topology
    if product is not None:
        annotations[labels.GPU_PRODUCT] = product
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": team.namespace,
            "labels": job_labels,
            "annotations": annotations,
        },
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [_container(gpus, milli)]}
            },
        },
    }


def _pick_team(rng: random.Random) -> Team:
    return rng.choices(TEAMS, weights=[t.weight for t in TEAMS])[0]


def _bad_job(index: int, name: str) -> tuple[Obj, str]:
    nlp, cv, research = TEAMS
    cases = (
        (job_object(name, nlp, queue="team-nlp-typo"), "bad-queue"),
        (job_object(name, cv, priority="urgent"), "bad-priority"),
        (job_object(name, nlp, pods=8, gpus=8), "bad-quota"),
        (job_object(name, research, product="B200"), "bad-product"),
    )
    return cases[index % len(cases)]


def _good_job(name: str, rng: random.Random) -> tuple[Obj, str]:
    team = _pick_team(rng)
    roll = rng.random()
    if roll < 0.10 and team.share_ok:
        return job_object(name, team, milli=rng.choice((250, 500))), "share"
    if roll < 0.16 and team.gang_ok:
        pods, gpus = rng.choice(((2, 8), (4, 4), (2, 4)))
        return job_object(name, team, pods=pods, gpus=gpus, topology="required:rack"), "gang"
    if roll < 0.32:
        return job_object(name, team, gpus=rng.choice((2, 4, 4, 8))), "multi-gpu"
    return job_object(name, team), "1-gpu"


def job_stream(spec: StreamSpec, rng: random.Random) -> list[JobSpec]:
    """Poisson arrivals over ``duration_s``; the bad jobs spread evenly among them."""
    jobs: list[JobSpec] = []
    at = 0.0
    mu = math.log(spec.median_run_s)
    while True:
        at += rng.expovariate(spec.rate)
        if at >= spec.duration_s:
            break
        name = f"job-{len(jobs):05d}"
        job, kind = _good_job(name, rng)
        run_s = min(spec.max_run_s, rng.lognormvariate(mu, spec.run_sigma))
        jobs.append(JobSpec(at, job, run_s, kind))
    if jobs and spec.bad_jobs:
        step = max(1, len(jobs) // (spec.bad_jobs + 1))
        for k in range(spec.bad_jobs):
            slot = min(len(jobs) - 1, step * (k + 1))
            job, kind = _bad_job(k, f"bad-{k:02d}")
            jobs.insert(slot, JobSpec(jobs[slot].at_s, job, 1.0, kind))
    return jobs
