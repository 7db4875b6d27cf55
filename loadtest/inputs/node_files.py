"""A real cluster's node list (Alibaba spot v2026, Alibaba openb) as the simulated fleet,
under the synthetic job stream.

Layer: PURE. Turns ``TraceNode`` rows (``loadtest.inputs.traces`` reads them) into the Node
objects and Kueue objects ``scenario`` runs with; no I/O, no clock. Must not invent what
the node list does not say, except the racks below, which are labelled as synthetic.

What each Node carries:

* the GPU model exactly as the file writes it as the GFD product label
  (``nvidia.com/gpu.product``), the GPU count as ``nvidia.com/gpu`` (and its milli),
  the file's CPU cores; memory is not in the spot file, so ``traces.read_spot_nodes``
  assumes 8 GiB per core (openb has a memory column);
* an NVLink island annotation only where the hardware fixes it: the 8-GPU HGX boards
  (A100-SXM4, A800-SXM4, H800) have one NVSwitch domain, so one island ``0-7``. The
  other models (PCIe A10s, the anonymised ``GPU-series-*``) are left unannotated: the
  extender then treats a node's GPUs as one island, its documented default;
* nodes with no GPU are CPU-only nodes: no product label, no GPU resources.

Topology: the node lists have none. The job stream's gangs ask for ``required:rack``, so
racks and blocks are synthetic, by one deterministic rule: nodes of one GPU model (and
the CPU-only nodes as one group), in file order, four to a rack and four racks to a
block; rack and block names carry ``synthetic``. They let the extender's topology path
work at this scale; they say nothing about where the real machines stand.

Queues: one ResourceFlavor per GPU model (the examples' flavors name other products), in
a Topology of the synthetic blocks and racks so that rack gangs are admitted, and for
each team a ClusterQueue in one cohort holding its share of every model's GPUs
(``trace_input.trace_policy``: the fleet's GPUs in all), with the examples' LocalQueues
and their rules (default priority, time limits, max GPUs per job). Each queue tries the
models with the most GPUs per node first, so multi-GPU jobs get boards that can hold
them while their quota lasts; a multi-GPU job admitted to a one-GPU model's flavor stays
pending, as it would under real Kueue with per-product flavors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from cluster import labels
from loadtest.inputs.fleet import BLOCK_LABEL, NODES_PER_RACK, RACK_LABEL, RACKS_PER_BLOCK
from loadtest.inputs.trace_input import trace_policy
from loadtest.inputs.traces import TraceNode, node_object

Obj = dict[str, Any]

NVSWITCH_BOARDS: Final = frozenset({"A100-SXM4-80GB", "A800-SXM4-80GB", "H800"})
"""8-GPU models whose GPUs all sit on one NVSwitch: one NVLink island per node."""


def fleet_nodes(nodes: Sequence[TraceNode]) -> list[Obj]:
    """Node objects with synthetic racks (see the module docstring), in file order."""
    groups: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        groups.setdefault(node.model if node.gpus else "", []).append(i)
    place: dict[int, tuple[str, str]] = {}
    rack_no = block_no = 0
    for members in groups.values():
        for start in range(0, len(members), NODES_PER_RACK):
            if start and start % (NODES_PER_RACK * RACKS_PER_BLOCK) == 0:
                block_no += 1
            for i in members[start : start + NODES_PER_RACK]:
                place[i] = (f"synthetic-rack-{rack_no:04d}", f"synthetic-block-{block_no:03d}")
            rack_no += 1
        block_no += 1
    out: list[Obj] = []
    for i, node in enumerate(nodes):
        rack, block = place[i]
        annotations = {}
        if node.gpus == 8 and node.model in NVSWITCH_BOARDS:
            annotations[labels.NVLINK_ISLANDS] = "0-7"
        obj = node_object(
            node, extra_labels={RACK_LABEL: rack, BLOCK_LABEL: block}, annotations=annotations
        )
        if not node.gpus:
            del obj["metadata"]["labels"][labels.GFD_PRODUCT]
            for part in ("capacity", "allocatable"):
                obj["status"][part].pop(labels.GPU_RESOURCE)
                obj["status"][part].pop(labels.GPU_MILLI_RESOURCE)
        out.append(obj)
    return out


def model_order(nodes: Sequence[TraceNode]) -> list[str]:
    """GPU models, most GPUs per node first (then most GPUs in all, then by name)."""
    per_node: dict[str, int] = {}
    total: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            per_node[node.model] = max(per_node.get(node.model, 0), node.gpus)
            total[node.model] = total.get(node.model, 0) + node.gpus
    return sorted(per_node, key=lambda m: (-per_node[m], -total[m], m))


def fleet_policy(nodes: Sequence[TraceNode], examples: Sequence[Obj]) -> list[Obj]:
    """Per-model flavors and per-team ClusterQueues for ``nodes``; the WorkloadPriority-
    Classes and LocalQueues of ``examples`` (the example manifests' objects)."""
    priorities = [o for o in examples if o.get("kind") == "WorkloadPriorityClass"]
    local_queues = [o for o in examples if o.get("kind") == "LocalQueue"]
    policy = trace_policy(nodes, priorities, model_order=model_order(nodes))
    return [o for o in policy if o.get("kind") != "LocalQueue"] + local_queues
