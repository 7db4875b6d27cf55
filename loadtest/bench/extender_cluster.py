"""What ``bench-extender`` and ``overload --server extender`` schedule: the cluster file
(``cache``'s fleet with a zone level above block: zone / block / rack / hostname) with its
pending pods, and the requests' pods and bodies.

Layer: PURE (seeded data in, JSON out) with one file write (``write_cluster``). Must not
decide anything the extender decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from cluster import labels as keys
from loadtest.bench.cache import BLOCK_LABEL, RACK_LABEL, write_fleet

ZONE_LABEL: Final = "topology.tessera.dev/zone"


BLOCKS_PER_ZONE: Final = 4


LEVELS: Final = f"zone={ZONE_LABEL},block={BLOCK_LABEL},rack={RACK_LABEL},hostname={keys.HOSTNAME}"


@dataclass
class Cluster:
    path: Path
    names: list[str]
    pending: list[dict[str, Any]]
    """Pending GPU pods as JSON, in arrival order (what the cycle schedules)."""
    bound: int


def write_cluster(path: Path, nodes: int, pods: int, seed: int) -> Cluster:
    """The fleet of ``cache`` with a fourth level (zone) above block."""
    names: list[str] = []
    pending: list[dict[str, Any]] = []

    def add_zone(node: dict[str, Any]) -> None:
        node_labels = node["metadata"]["labels"]
        block = int(node_labels[BLOCK_LABEL][1:])
        node_labels[ZONE_LABEL] = f"z{block // BLOCKS_PER_ZONE:02d}"
        names.append(node["metadata"]["name"])

    bound, _ = write_fleet(path, nodes, pods, seed, label_node=add_zone, on_pending=pending.append)
    return Cluster(path, names, pending, bound)


def probe_pod(gpus: int = 1, milli: int = 0, *, version: str | None = None) -> dict[str, Any]:
    """The pod of the per-verb runs: one GPU (or a share), not in the cache, no gang.

    Without a ``version`` (``metadata.resourceVersion``) each request decodes it, as a
    new pod's would; with one, the extender decodes it once and knows it after, as it
    knows the pod of a ``/prioritize`` from the ``/filter`` just before.
    """
    resource = keys.GPU_RESOURCE if gpus else keys.GPU_MILLI_RESOURCE
    amount = str(gpus or milli)
    metadata: dict[str, Any] = {
        "name": "probe-0",
        "namespace": "team-00",
        "uid": "20000000-0000-4000-8000-000000000000",
        "labels": {keys.QUEUE_NAME: "research"},
    }
    if version is not None:
        metadata["resourceVersion"] = version
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "activeDeadlineSeconds": 3600,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:2026.01",
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", resource: amount},
                        "limits": {resource: amount},
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def args_body(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    return jsonio.dumps({"Pod": pod, "NodeNames": list(names), "Nodes": None})
