"""GPU arithmetic on one node: which GPUs a pod takes, how many pods fit, fragmentation.

Layer: PURE. Functions of a ``NodeState``, a ``PodDemand`` and the config: no I/O, no
clock, no cache, no request context. Must not give reasons or scores (``filters`` and
``scores`` do, from these numbers).

The model of a node (``cluster.model``): GPUs with an index, an NVLink island, health
and free milli-GPUs. Unhealthy GPUs are never counted or chosen. A whole-GPU pod takes
GPUs nobody uses; a share takes part of one GPU. ``choose_gpus`` is the single place
that picks GPUs: the GPU filter is "it found some", so a node that passes the filters
always has an assignment at bind.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from itertools import accumulate

from cluster.model import MILLI_PER_GPU, GpuDevice, NodeState, PodDemand, product_matches
from extender.config import ExtenderConfig, MixEntry


def islands(node: NodeState) -> tuple[dict[int, list[GpuDevice]], dict[int, int]]:
    """Whole-free GPUs per island (index order) and healthy GPUs per island."""
    free: dict[int, list[GpuDevice]] = {}
    healthy: dict[int, int] = {}
    for gpu in node.gpus:
        if gpu.healthy:
            healthy[gpu.island] = healthy.get(gpu.island, 0) + 1
            if gpu.free_milli >= MILLI_PER_GPU:
                free.setdefault(gpu.island, []).append(gpu)
    return free, healthy


def one_island(k: int, healthy: Mapping[int, int], islands_required: bool) -> bool:
    """Whether ``k`` whole GPUs must come from one island: the rule is on, and some
    island has ``k`` healthy GPUs (a pod larger than every island must span)."""
    return islands_required and k <= max(healthy.values(), default=0)


def choose_gpus(
    node: NodeState, demand: PodDemand, config: ExtenderConfig
) -> tuple[int, ...] | None:
    """The GPU indices ``demand`` takes on ``node`` (ascending), or None if it cannot.

    Whole GPUs: from the island with the fewest free GPUs that holds them all (best
    fit keeps large islands whole); when none holds them and they need not be in one
    island, from as few islands as possible. A share: the healthy GPU with the least
    free milli that holds it, preferring GPUs in busier islands on a tie. A pod
    without GPUs takes ``()``.
    """
    if demand.gpus > 0:
        return _choose_whole(node, demand.gpus, config.islands_required)
    if demand.gpu_milli > 0:
        return _choose_share(node, demand.gpu_milli)
    return ()


def _choose_whole(node: NodeState, k: int, islands_required: bool) -> tuple[int, ...] | None:
    free, healthy = islands(node)
    holding = [island for island, gpus in free.items() if len(gpus) >= k]
    if holding:
        best = min(holding, key=lambda island: (len(free[island]), island))
        return tuple(g.index for g in free[best][:k])
    if one_island(k, healthy, islands_required) or sum(map(len, free.values())) < k:
        return None
    pool = sorted(free, key=lambda island: (-len(free[island]), island))
    chosen: list[int] = []
    remaining = k
    while remaining > 0:
        holding = [island for island in pool if len(free[island]) >= remaining]
        if holding:
            last = min(holding, key=lambda island: (len(free[island]), island))
            chosen.extend(g.index for g in free[last][:remaining])
            break
        largest = pool.pop(0)
        chosen.extend(g.index for g in free[largest])
        remaining -= len(free[largest])
    return tuple(sorted(chosen))


def _choose_share(node: NodeState, milli: int) -> tuple[int, ...] | None:
    whole_free: dict[int, int] = {}
    for gpu in node.gpus:
        if gpu.healthy and gpu.free_milli >= MILLI_PER_GPU:
            whole_free[gpu.island] = whole_free.get(gpu.island, 0) + 1
    best: tuple[int, int, int] | None = None
    for gpu in node.gpus:
        if gpu.healthy and gpu.free_milli >= milli:
            key = (gpu.free_milli, whole_free.get(gpu.island, 0), gpu.index)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2],)


def island_counts(node: NodeState, *, empty: bool = False) -> tuple[dict[int, int], dict[int, int]]:
    """Whole-free healthy GPUs per island (with ``empty``: as if no pod held any) and
    healthy GPUs per island."""
    return _island_counts(node.gpus, empty)


def _island_counts(gpus: Sequence[GpuDevice], empty: bool) -> tuple[dict[int, int], dict[int, int]]:
    whole: dict[int, int] = {}
    healthy: dict[int, int] = {}
    for gpu in gpus:
        if gpu.healthy:
            healthy[gpu.island] = healthy.get(gpu.island, 0) + 1
            if empty or gpu.free_milli >= MILLI_PER_GPU:
                whole[gpu.island] = whole.get(gpu.island, 0) + 1
    return whole, healthy


def pod_fits(
    node: NodeState, demand: PodDemand, islands_required: bool, *, empty: bool = False
) -> int:
    """How many pods like ``demand`` the node's healthy GPUs hold at once: now, or with
    ``empty`` as if no other pod held any. A pod without GPUs: the node's pod limit."""
    if not demand.uses_gpu:
        return node.max_pods
    return gpus_fit(node.gpus, demand, islands_required, empty=empty)


def gpus_fit(
    gpus: Sequence[GpuDevice], demand: PodDemand, islands_required: bool, *, empty: bool = False
) -> int:
    """``pod_fits`` of a GPU pod on a node's ``gpus`` alone: for a caller that follows a
    node's GPUs through many states (``extender.reservations``) without making a
    ``NodeState`` of each."""
    if demand.gpus > 0:
        k = demand.gpus
        counts, healthy = _island_counts(gpus, empty)
        if one_island(k, healthy, islands_required):
            return sum(c // k for c in counts.values())
        return sum(counts.values()) // k
    m = demand.gpu_milli
    if m <= 0:
        return 0
    return sum((MILLI_PER_GPU if empty else gpu.free_milli) // m for gpu in gpus if gpu.healthy)


def fragmentation(
    node: NodeState,
    mix: tuple[MixEntry, ...],
    islands_required: bool,
    cpu_free: int | None = None,
    cpu_stranding: float = 0.0,
) -> float:
    """Free milli-GPUs of ``node`` that the expected pods could not use, averaged over the
    mix by weight: the FGD measure (Weng et al., ATC'23), with NVLink islands and CPU.

    For a share of ``m``: GPUs with less than ``m`` free are fragments. For ``k`` whole
    GPUs: partly used GPUs are fragments, and so are whole-free GPUs in islands with
    fewer than ``k`` free when ``k`` must fit in one island. A pod size the node cannot
    take at all (a product it does not accept, too few GPUs, or, when ``cpu_free`` is
    known, too little CPU) leaves every free milli a fragment; so does a pod without
    GPUs. When the CPU holds fewer pods of a size than its usable GPUs would, the GPUs
    it cannot serve (those with the least free) count ``cpu_stranding`` of their free
    milli as fragments. The pods the CPU holds are counted as a fraction (free CPU over
    the size's CPU): with 25 cores and pods of 10, two and a half GPUs are served.
    """
    frees = sorted(gpu.free_milli for gpu in node.gpus if gpu.healthy)
    total = sum(frees)
    if total == 0:
        return 0.0
    whole, healthy = island_counts(node)
    prefix = [0, *accumulate(frees)]
    count, largest = len(frees), frees[-1]
    stranding_cpu = cpu_free if cpu_stranding else None
    # per call, not per entry: many sizes share a GPU count or a product list
    usable_for: dict[int, int] = {}
    accepts: dict[tuple[str, ...], bool] = {}
    weighted = 0.0
    weights = 0.0
    for entry in mix:
        weight = entry.weight
        weights += weight
        if not entry.uses_gpus or (cpu_free is not None and entry.cpu_milli > cpu_free):
            weighted += weight * total
            continue
        products = entry.products
        if products:
            ok = accepts.get(products)
            if ok is None:
                ok = accepts[products] = any(product_matches(p, node.product) for p in products)
            if not ok:
                weighted += weight * total
                continue
        # pods of this size the CPU can still hold (only the GPU count limits without
        # CPU), as a fraction: pods of a size ask for CPU around its typical value, so
        # each core short strands part of a GPU, not a whole GPU at a floor's step
        by_cpu: float = (
            stranding_cpu / entry.cpu_milli
            if stranding_cpu is not None and entry.cpu_milli
            else count
        )
        k = entry.gpus
        if k > 0:
            usable = usable_for.get(k)
            if usable is None:
                usable = usable_for[k] = _usable_whole(k, whole, healthy, islands_required)
            if not usable:
                frag: float = total
            else:
                served = min(usable, by_cpu * k)
                frag = total - usable * MILLI_PER_GPU
                frag += cpu_stranding * (usable - served) * MILLI_PER_GPU
        elif largest < entry.gpu_milli:
            frag = total
        else:
            first = bisect.bisect_left(frees, entry.gpu_milli)
            frag = prefix[first] + cpu_stranding * _least_free(
                frees, prefix, first, count - first - by_cpu
            )
        weighted += weight * frag
    return weighted / weights


def _usable_whole(
    k: int, whole: Mapping[int, int], healthy: Mapping[int, int], islands_required: bool
) -> int:
    """Whole-free GPUs that pods of ``k`` whole GPUs can use: in islands holding ``k``
    when they must come from one island, all of them when ``k`` fit, else none."""
    if one_island(k, healthy, islands_required):
        return sum(c for c in whole.values() if c >= k)
    whole_total = sum(whole.values())
    return whole_total if whole_total >= k else 0


def _least_free(frees: list[int], prefix: list[int], first: int, count: float) -> float:
    """The free milli of the ``count`` (a fraction, or none) GPUs with the least free
    from ``frees[first]`` on (``frees`` sorted, ``prefix`` its running sums)."""
    if count <= 0:
        return 0.0
    whole = int(count)
    held = float(prefix[first + whole] - prefix[first])
    if first + whole < len(frees):
        held += (count - whole) * frees[first + whole]
    return held
