"""What ``bench-webhook`` sends and against which policy: a generated queue policy of
``--queues`` LocalQueues (namespaces of teams, ClusterQueues in cohorts, H100/H200/A100/L40S
flavors reserved and spot, a Topology, priority classes and the ``tessera.dev/*``
annotations) in which the captured Job's queue exists, and that captured review.

Layer: PURE (``policy_objects``: a seeded ``random.Random`` in, Kueue objects out) with
two file helpers (``write_policy``, ``load_captured_review``). Shared by the webhook
benchmarks, ``overload`` and ``review_cpu``; must not decide what the webhook answers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from cluster import jsonio
from cluster import labels as keys
from loadtest.measure.pinned import ROOT, BenchError

DEFAULT_CAPTURES: Final = ROOT.parent / "shared" / "captures"
CAPTURED_JOB: Final = "000-webhook-mutate-request.json"
CAPTURED_NAMESPACE: Final = "team-nlp"
CAPTURED_QUEUE: Final = "team-nlp-queue"
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
