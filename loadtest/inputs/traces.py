"""Real cluster traces (Alibaba openb, Alibaba spot v2026) as Kubernetes objects.

Layer: I/O (reads CSV files). Turns trace rows into the Node and Pod JSON that
kube-apiserver would hold, so that the load test and the benchmarks feed the servers
exactly what a watch would. Must not decide placement and must not copy trace data
anywhere: the traces stay in the shared data folder.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import labels

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
"""Where the traces live next to a checkout (``../shared/data``)."""

OPENB = "alibaba-gpu-v2023"
SPOT = "alibaba-spot-gpu-v2026"
OPENB_POD_VARIANTS = (
    "default",
    "gpushare40",
    "gpushare60",
    "multigpu20",
    "multigpu30",
    "cpu050",
    "cpu100",
    "gpuspec10",
    "gpuspec20",
)


class TraceMissing(FileNotFoundError):
    """The shared data folder (or one file in it) is absent; the message says what to do."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    creation_time: int | None = None
    deletion_time: int | None = None

    @property
    def gpu_demand_milli(self) -> int:
        """GPU capacity the pod asks for, the FGD way: milli per GPU times GPUs."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0


def trace_file(data_dir: Path, dataset: str, name: str) -> Path:
    path = data_dir / dataset / name
    if not path.is_file():
        raise TraceMissing(
            f"trace file {path} is not there: the traces are read from the shared data "
            f"folder (see its README), never copied into the repository; point "
            f"TESSERA_DATA at a folder that holds {dataset}/{name}"
        )
    return path


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="") as handle:
        yield from csv.DictReader(handle)


def _optional_int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def read_openb_nodes(data_dir: Path, *, gpu_only: bool = True) -> list[TraceNode]:
    name = "openb_node_list_gpu_node.csv" if gpu_only else "openb_node_list_all_node.csv"
    return [
        TraceNode(
            name=row["sn"],
            cpu_milli=int(row["cpu_milli"]),
            memory_mib=int(row["memory_mib"]),
            gpus=int(row["gpu"]),
            model=row["model"],
        )
        for row in _rows(trace_file(data_dir, OPENB, name))
    ]


def read_openb_pods(data_dir: Path, variant: str = "default") -> list[TracePod]:
    pods = []
    for row in _rows(trace_file(data_dir, OPENB, f"openb_pod_list_{variant}.csv")):
        num_gpu = int(row["num_gpu"])
        # The FGD method: gpu_milli means something only for GPU pods, clipped to 1..1000.
        gpu_milli = min(max(int(row["gpu_milli"]), 1), 1000) if num_gpu else 0
        spec = row.get("gpu_spec") or ""
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=tuple(s for s in spec.split("|") if s),
                creation_time=_optional_int(row.get("creation_time")),
                deletion_time=_optional_int(row.get("deletion_time")),
            )
        )
    return pods


def read_spot_nodes(data_dir: Path) -> list[TraceNode]:
    return [
        TraceNode(
            name=f"spot-node-{int(row['node_name']):05d}",
            cpu_milli=int(float(row["cpu_num"]) * 1000),
            # The spot trace has no memory column; 8 GiB per core is the common shape.
            memory_mib=int(float(row["cpu_num"]) * 8192),
            gpus=int(row["gpu_capacity_num"]),
            model=row["gpu_model"],
        )
        for row in _rows(trace_file(data_dir, SPOT, "node_info_df.csv"))
    ]


def node_object(
    node: TraceNode,
    *,
    extra_labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Node a kubelet with the NVIDIA device plugin and GFD would register."""
    allocatable = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": "1001",
        labels.GPU_RESOURCE: str(node.gpus),
        labels.GPU_MILLI_RESOURCE: str(node.gpus * 1000),
    }
    node_labels = {labels.HOSTNAME: node.name, labels.GFD_PRODUCT: node.model}
    node_labels.update(extra_labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": node_labels,
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable},
    }


def pod_object(
    pod: TracePod, *, namespace: str = "trace", uid: str | None = None
) -> dict[str, Any]:
    """A pending Pod asking for what the trace row asks for."""
    requests: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.num_gpu and pod.gpu_milli >= 1000:
        requests[labels.GPU_RESOURCE] = str(pod.num_gpu)
    elif pod.num_gpu:
        requests[labels.GPU_MILLI_RESOURCE] = str(pod.gpu_milli)
    annotations = {labels.GPU_PRODUCT: "|".join(pod.gpu_spec)} if pod.gpu_spec else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "uid": uid or f"uid-{pod.name}",
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": labels.DEFAULT_SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "trace", "resources": {"requests": requests}}],
        },
        "status": {"phase": "Pending"},
    }
