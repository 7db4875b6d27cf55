"""GPU accounting of one node: what is free on it, given the node as the watch reports it
and the pods placed on it.

Layer: PURE. Functions of a ``NodeState`` and the pods on it: no I/O, no clock, no
logging, no asyncio, and no state of the cache's. The cache (``cluster.cache``) passes in
what it holds (the pods seated on the node, their allocations, which are assumed) and
writes back what ``account_node`` returns; this module must not reach into the cache or
decide where a pod should go (``pick_gpus``'s simple rule, for pods bound without
``tessera.dev/gpu-indices``, is all it chooses).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, replace

from cluster.labels import GPU_INDICES
from cluster.model import Allocation, GpuDevice, NodeState, PodDemand, PodInfo, PodKey
from cluster.snapshot import gpus_needed, indices_match, pick_gpus

Seated = Mapping[PodKey, tuple[Allocation | None, int]]
"""The GPU pods placed on one node: each one's exact allocation (``None`` where the GPUs
are picked here) and the CPU it asks."""

AllocationOf = Callable[[PodKey], Allocation | None]


class GpuPool:
    """Shared ``GpuDevice`` values for the GPUs of accounted nodes.

    GPUs that differ only in free milli are few; sharing them keeps node rebuilds cheap
    (no dataclass construction) and memory flat. Sharing equal values changes no result:
    an accounted node is the same whether or not its GPUs came from the pool.
    """

    __slots__ = ("_shared",)

    def __init__(self) -> None:
        self._shared: dict[tuple[int, int, bool, int], GpuDevice] = {}

    def with_used(self, base: NodeState, used: Mapping[int, int], cpu: int = 0) -> NodeState:
        """``base`` with ``used`` milli taken from each GPU (free clamped at 0) and
        ``cpu`` requested."""
        if not any(used.values()):
            return replace(base, cpu_requested_milli=cpu) if cpu else base
        pool = self._shared
        gpus = []
        for gpu in base.gpus:
            taken = used[gpu.index]
            if not taken:
                gpus.append(gpu)
                continue
            shape = (gpu.index, gpu.island, gpu.healthy, max(0, gpu.free_milli - taken))
            gpus.append(pool.get(shape) or pool.setdefault(shape, GpuDevice(*shape)))
        return replace(base, gpus=tuple(gpus), cpu_requested_milli=cpu)


@dataclass(frozen=True, slots=True)
class Accounted:
    """One node accounted: the node with every allocation applied, the GPUs picked for
    pods bound without usable indices, and the accounting problems found."""

    node: NodeState
    picked: tuple[tuple[PodKey, Allocation], ...]
    problems: tuple[str, ...]


def account_node(
    base: NodeState,
    seated: Seated,
    cpu_only: int,
    *,
    pod_of: Callable[[PodKey], PodInfo | None],
    allocation_of: AllocationOf,
    assumed: Container[PodKey],
    pool: GpuPool,
) -> Accounted:
    """Recompute one node from its base and the pods on it: exact allocations first,
    then GPUs for pods bound without indices (kept where they were, ``allocation_of``,
    if they still fit, so they do not wander). ``cpu_only``: CPU asked by the pods
    without GPUs placed here."""
    name = base.name
    capacity = {gpu.index: gpu.free_milli for gpu in base.gpus}
    used = dict.fromkeys(capacity, 0)
    problems: list[str] = []
    picked_keys: list[PodKey] = []
    for key, (allocation, _) in seated.items():
        if allocation is None:
            picked_keys.append(key)
            continue
        for index in allocation.indices:
            if index in used:
                used[index] += allocation.milli_per_gpu
            else:
                problems.append(f"pod {key} holds GPU {index}, which node {name} lacks")
    picked: dict[PodKey, Allocation] = {}
    for key in picked_keys:
        pod = pod_of(key)
        assert pod is not None, f"{key} sits on node {name} but is not known"
        picked[key] = _pick(
            key,
            pod.demand,
            base,
            allocation_of(key),
            pool,
            capacity=capacity,
            used=used,
            problems=problems,
        )
    cpu = cpu_only + sum(cpu for _, cpu in seated.values())
    for index, milli in used.items():
        if milli > capacity[index]:

            def now_held(key: PodKey) -> Allocation | None:
                return picked[key] if key in picked else allocation_of(key)

            problems.append(
                f"GPU {index} on node {name} is over-committed ({milli} of "
                f"{capacity[index]} milli): held by {holders(seated, index, now_held, assumed)}"
            )
    return Accounted(pool.with_used(base, used, cpu), tuple(picked.items()), tuple(problems))


def _pick(
    key: PodKey,
    demand: PodDemand,
    base: NodeState,
    previous: Allocation | None,
    pool: GpuPool,
    *,
    capacity: Mapping[int, int],
    used: dict[int, int],
    problems: list[str],
) -> Allocation:
    milli = demand.milli_per_gpu
    if (
        previous is not None
        and previous.node == base.name
        and previous.milli_per_gpu == milli
        and indices_match(previous.indices, demand)
        and all(i in used and used[i] + milli <= capacity[i] for i in previous.indices)
    ):
        indices = previous.indices
    else:
        found = pick_gpus(pool.with_used(base, used), demand)
        if found is None:
            found = _forced_pick(base, used, demand)
            problems.append(
                f"pod {key} is bound to node {base.name} without {GPU_INDICES} and no "
                f"GPUs are free for it: counted on GPU(s) {','.join(map(str, found))}"
            )
        indices = found
        previous = None
    for index in indices:
        used[index] += milli
    return previous or Allocation(base.name, indices, milli)


def _forced_pick(base: NodeState, used: Mapping[int, int], demand: PodDemand) -> tuple[int, ...]:
    """GPUs to count a bound pod on when none are free for it: the emptiest ones."""
    order = sorted(base.gpus, key=lambda g: (used[g.index] - g.free_milli, g.index))
    return tuple(sorted(g.index for g in order[: gpus_needed(demand)]))


def holders(
    seated: Seated, index: int, allocation_of: AllocationOf, assumed: Container[PodKey]
) -> str:
    """Who holds GPU ``index`` among the pods ``seated`` on its node, for a message."""
    found = []
    for key, (exact, _) in sorted(seated.items()):
        alloc = allocation_of(key)
        if alloc is not None and index in alloc.indices:
            how = "assumed" if key in assumed else "bound"
            if exact is None:
                how += f" without {GPU_INDICES}"
            found.append(f"{key} ({alloc.milli_per_gpu} milli, {how})")
    return ", ".join(found) or "nobody"
