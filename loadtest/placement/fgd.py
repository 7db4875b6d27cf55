"""The arithmetic of the FGD artifact's placement method (``../shared/data/README.md``).

Layer: PURE. Plain functions over ints, tuples and a seeded ``random.Random`` handed in:
no I/O, no clock, no cluster objects. ``study`` runs the simulation with them; the unit
tests check each rule on hand-computed cases. Must not know which policy or trace it
serves.

* ``arrival_sequence``: the whole trace shuffled, then draws with replacement until the
  next draw would push the arrived GPU demand past the limit (130 %).
* ``allocation_curve``: allocation % averaged per rounded arrived %.
* ``bestfit_score``: the calibration baseline's integer score.
* ``typical_shapes`` / ``fgd_fragmentation`` / ``fgd_score``: Fragmentation Gradient
  Descent (Weng et al., ATC'23) as its artifact scores a node: the fragmentation of the
  node's free GPUs against the trace's most popular pod shapes, before and after the
  pod, through a sigmoid onto 0-100.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from loadtest.inputs.asks import PodAsk

MILLI: Final = 1000
BESTFIT_CPU_SCALE: Final = 128_000
BESTFIT_GPU_SCALE: Final = 8_000
MAX_SCORE: Final = 100


# ---------------------------------------------------------------- the sequence


def arrival_sequence(
    demands: Sequence[int], capacity_milli: int, rng: random.Random, limit: float = 1.30
) -> list[int]:
    """Indices into the trace in arrival order for one seed.

    The whole trace first, shuffled; then draws with replacement, appended until the
    next draw would push the arrived GPU demand past ``limit`` times capacity (that draw is
    not taken, and the sequence ends there). A trace that alone exceeds the limit is
    still played whole: the limit only stops the draws.
    """
    order = list(range(len(demands)))
    rng.shuffle(order)
    arrived = sum(demands)
    bound = limit * capacity_milli
    while True:
        pick = rng.randrange(len(demands))
        if arrived + demands[pick] > bound:
            return order
        order.append(pick)
        arrived += demands[pick]


def node_order(count: int, rng: random.Random) -> list[int]:
    """Tie-break rank of each node (0 wins): a random permutation fixed per seed."""
    ranks = list(range(count))
    rng.shuffle(ranks)
    return ranks


# ---------------------------------------------------------------- the metric


def arrived_percent(arrived_milli: int, capacity_milli: int) -> int:
    """Arrived load rounded to a whole percent, halves away from zero (like Go's
    ``math.Round``; Python's ``round`` would send 0.5 to the even neighbour)."""
    return math.floor(100.0 * arrived_milli / capacity_milli + 0.5)


def allocation_curve(points: Iterable[tuple[int, int]], capacity_milli: int) -> dict[int, float]:
    """Mean allocation % per rounded arrived %, from one (arrived, allocated) milli pair
    recorded after every pod (placed, skipped or CPU-only)."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for arrived, allocated in points:
        x = arrived_percent(arrived, capacity_milli)
        sums[x] = sums.get(x, 0.0) + 100.0 * allocated / capacity_milli
        counts[x] = counts.get(x, 0) + 1
    return {x: sums[x] / counts[x] for x in sorted(sums)}


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ---------------------------------------------------------------- scores


def bestfit_score(cpu_free: int, cpu_req: int, gpu_free_milli: int, gpu_req_milli: int) -> int:
    """The README's BestFit: the less CPU and GPU the node has left after the pod, the
    higher; truncated to an integer like the artifact's ``int64`` conversion."""
    left = (
        1.0
        - 0.5 * (cpu_free - cpu_req) / BESTFIT_CPU_SCALE
        - 0.5 * (gpu_free_milli - gpu_req_milli) / BESTFIT_GPU_SCALE
    )
    return int(MAX_SCORE * left)


def spread_score(free: Sequence[int], request: Sequence[int], capacity: Sequence[int]) -> int:
    """kube-scheduler's LeastAllocated: the mean share each resource keeps free after
    the pod, over the resources the node has (CPU, memory, GPU milli), 0-100."""
    shares = [(f - r) / c for f, r, c in zip(free, request, capacity, strict=True) if c > 0]
    if not shares:
        return 0
    return int(MAX_SCORE * sum(shares) / len(shares))


def tightest_gpu(frees: Sequence[int], milli: int) -> int | None:
    """The baselines' choice for a share: the GPU with the least free milli that holds
    it, the lowest index on ties."""
    best: int | None = None
    for i, free in enumerate(frees):
        if free >= milli and (best is None or free < frees[best]):
            best = i
    return best


def lowest_free_gpus(frees: Sequence[int], count: int) -> list[int] | None:
    """The baselines' choice for whole GPUs: the lowest-index fully free ones."""
    chosen = [i for i, free in enumerate(frees) if free >= MILLI][:count]
    return chosen if len(chosen) == count else None


# ---------------------------------------------------------------- FGD


@dataclass(frozen=True, slots=True)
class Typical:
    """One of the trace's popular pod shapes and its share of the mix (sums to 1)."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: tuple[str, ...]
    weight: float


def typical_shapes(shapes: Iterable[PodAsk], threshold: float = 0.95) -> tuple[Typical, ...]:
    """The most popular (CPU, milli per GPU, GPUs, models) of the trace that together
    cover ``threshold`` of its pods, weights renormalized: the artifact's typical pods
    (CPU-only pods included, popularity 95 %, step 1)."""
    counts: dict[tuple[int, int, int, tuple[str, ...]], int] = {}
    total = 0
    for s in shapes:
        key = (s.cpu_milli, s.gpu_milli if s.num_gpu else 0, s.num_gpu, s.gpu_spec)
        counts[key] = counts.get(key, 0) + 1
        total += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
    covered = 0
    for key, n in ranked:
        if covered >= threshold * total:
            break
        kept.append((key, n))
        covered += n
    return tuple(Typical(c, m, g, spec, n / covered) for (c, m, g, spec), n in kept)


def fgd_fragmentation(
    frees: Sequence[int], cpu_free: int, model: str, typical: Sequence[Typical]
) -> float:
    """Expected free milli-GPUs of a node that the typical pods could not use.

    Per typical pod: if the node could host it (model allowed, ``num_gpu`` GPUs with
    enough free, enough CPU), only the GPUs with less free than its share are
    fragments; otherwise every free milli is (the artifact also counts all free GPU
    milli for CPU-only pods, whatever the CPU: a constant per node that shifts every
    node's delta alike).
    """
    total = sum(frees)
    if total == 0:
        return 0.0
    frag = 0.0
    for t in typical:
        if t.gpu_milli == 0:
            frag += t.weight * total
            continue
        if t.gpu_spec and model not in t.gpu_spec:
            frag += t.weight * total
            continue
        holding = sum(1 for f in frees if f >= t.gpu_milli)
        if holding >= t.num_gpu and cpu_free >= t.cpu_milli:
            frag += t.weight * sum(f for f in frees if f < t.gpu_milli)
        else:
            frag += t.weight * total
    return frag


def sigmoid(gain: float) -> float:
    """A fragmentation decrease (milli) onto 0..100: 50 for none, towards 100 for more."""
    exponent = max(-50.0, min(50.0, -gain / MILLI))
    return MAX_SCORE / (1.0 + math.exp(exponent))


def sigmoid_score(gain: float) -> int:
    """The artifact's integer score: ``sigmoid`` truncated."""
    return int(sigmoid(gain))


def fgd_choice(
    frees: Sequence[int],
    cpu_free: int,
    model: str,
    shape: PodAsk,
    typical: Sequence[Typical],
    *,
    integer: bool = True,
) -> tuple[float, list[int]] | None:
    """FGD's score of a node for ``shape`` and the GPUs it would take, or None if the
    GPUs cannot hold it. A share tries each GPU that holds it and keeps the first with
    the best score; whole GPUs take the lowest-index free ones."""
    to_score = sigmoid_score if integer else sigmoid
    before = fgd_fragmentation(frees, cpu_free, model, typical)
    cpu_after = cpu_free - shape.cpu_milli
    if shape.num_gpu == 0:
        # its CPU can still strand GPUs that the typical pods would need CPU for
        return to_score(before - fgd_fragmentation(frees, cpu_after, model, typical)), []
    if shape.gpu_milli < MILLI:
        best: tuple[float, list[int]] | None = None
        after = list(frees)
        for i, free in enumerate(frees):
            if free < shape.gpu_milli:
                continue
            after[i] = free - shape.gpu_milli
            score = to_score(before - fgd_fragmentation(after, cpu_after, model, typical))
            after[i] = free
            if best is None or score > best[0]:
                best = (score, [i])
        return best
    chosen = lowest_free_gpus(frees, shape.num_gpu)
    if chosen is None:
        return None
    after = list(frees)
    for i in chosen:
        after[i] = 0
    gain = before - fgd_fragmentation(after, cpu_after, model, typical)
    return to_score(gain), chosen
