"""What the extender's decisions depend on besides the cluster: levels, weights, pod mix.

Layer: PURE. Frozen values only: no settings parsing, no environment, no I/O. The
extender's settings (read at the root) build one ``ExtenderConfig``; tests build their
own. Invalid values raise ``ValueError`` at construction, so a decision never meets one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from cluster.labels import HOSTNAME
from cluster.model import MILLI_PER_GPU, PodDemand, level_short_name


@dataclass(frozen=True, slots=True)
class TopologyLevel:
    """One level of the topology: the name gangs use (``rack``) and its node label."""

    name: str
    node_label: str

    def __post_init__(self) -> None:
        if not self.name or not self.node_label:
            raise ValueError(f"a topology level needs a name and a node label: {self!r}")

    def answers_to(self, level: str) -> bool:
        """Whether ``tessera.dev/topology`` may name this level as ``level``.

        The webhook accepts a level's full node label or the label's name part (after
        the last ``/``) and copies the annotation down as written, so the extender
        accepts the same spellings, and the configured name as well.
        """
        return level in (self.name, self.node_label, level_short_name(self.node_label))


HOSTNAME_LEVEL = TopologyLevel("hostname", HOSTNAME)


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Relative weights of the scorers; the combined score is their weighted mean."""

    packing: float = 10.0
    """Fragmentation-aware packing (FGD): keep what is free usable by the expected pods."""
    island_fit: float = 0.0
    """Best fit inside the node: the tightest NVLink island, or the tightest shared GPU.
    Off by default: packing already sees islands (a whole-free GPU in an island too
    small for a pod size is a fragment) and ``choose_gpus`` takes the tightest island
    or GPU inside the node; on the openb traces even a weight of 0.2 against packing's
    10 cost up to 0.3 points of allocation by overruling packing's near-ties."""
    gang_locality: float = 5.0
    """Members of one gang close together (``preferred:<level>``, then any level)."""

    def __post_init__(self) -> None:
        weights = (self.packing, self.island_fit, self.gang_locality)
        if any(w < 0 for w in weights) or not any(weights):
            raise ValueError(f"scoring weights must be >= 0 and not all 0: {self!r}")

    @property
    def total(self) -> float:
        return self.packing + self.island_fit + self.gang_locality


@dataclass(frozen=True, slots=True)
class MixEntry:
    """A pod size the cluster expects, and how often: ``gpus`` whole GPUs, a share of
    ``gpu_milli``, or neither (a pod without GPUs), with the CPU it asks for (a node
    without that much CPU cannot use its GPUs) and the GPU products it accepts (empty:
    any)."""

    gpus: int = 0
    gpu_milli: int = 0
    weight: float = 1.0
    cpu_milli: int = 0
    products: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        whole, share = self.gpus > 0, 0 < self.gpu_milli < MILLI_PER_GPU
        if (
            (whole and share)
            or self.gpus < 0
            or (self.gpu_milli and not share)
            or self.weight <= 0
            or self.cpu_milli < 0
        ):
            raise ValueError(
                f"a pod size is whole GPUs, one share of 1-999 milli or no GPU, "
                f"with a positive weight and no negative CPU: {self!r}"
            )

    @property
    def uses_gpus(self) -> bool:
        return self.gpus > 0 or self.gpu_milli > 0


DEFAULT_POD_MIX: tuple[MixEntry, ...] = (
    MixEntry(gpu_milli=250, weight=1.0),
    MixEntry(gpu_milli=500, weight=2.0),
    MixEntry(gpus=1, weight=4.0),
    MixEntry(gpus=2, weight=1.0),
    MixEntry(gpus=4, weight=1.0),
    MixEntry(gpus=8, weight=1.0),
)
"""Used until a real mix is known: mostly single GPUs and halves, some large jobs."""

MIX_COVERAGE = 0.95
"""The share of a workload's pods that its pod mix covers (FGD's "typical pods")."""


PodShape = tuple[int, int, int, tuple[str, ...]]
"""A pod size as the mix counts it: (whole GPUs, share milli, CPU milli, products)."""


_RAW_SHAPE = attrgetter("gpus", "gpu_milli", "cpu_milli", "products")


def count_shapes(demands: Iterable[PodDemand]) -> dict[PodShape, int]:
    """How many pods of each shape ``demands`` holds. Counts of several batches add up
    (``collections.Counter.update``) to the counts of all of them, so a caller may count
    a large workload a batch at a time."""
    # the fields are read and counted in C; only distinct ones are looked at in Python
    raw = Counter(map(_RAW_SHAPE, demands))
    counts: dict[PodShape, int] = {}
    for (gpus, milli, cpu_milli, products), n in raw.items():
        cpu = max(0, cpu_milli)
        if gpus > 0:
            shape = (gpus, 0, cpu, products)
        elif 0 < milli < MILLI_PER_GPU:
            shape = (0, milli, cpu, products)
        else:
            shape = (0, 0, cpu, ())
        counts[shape] = counts.get(shape, 0) + n
    return counts


def mix_from_demands(
    demands: Iterable[PodDemand], coverage: float = MIX_COVERAGE
) -> tuple[MixEntry, ...]:
    """The pod mix of a workload (FGD's "typical pods"): its most frequent pod shapes
    (GPUs, share, CPU, accepted products) that together cover ``coverage`` of its pods,
    each weighted by how often it occurs.

    Shapes are kept exact: a share of 470 and one of 460 leave different fragments.
    Pods without GPUs are part of the mix: they use none of a node's free GPU capacity,
    so their weight is the chance that the next pod leaves it all unused. An empty
    workload, or one without GPU pods, gives ``DEFAULT_POD_MIX``.
    """
    _check_coverage(coverage)
    return mix_from_counts(count_shapes(demands), coverage)


def mix_from_counts(
    counts: Mapping[PodShape, int], coverage: float = MIX_COVERAGE
) -> tuple[MixEntry, ...]:
    """``mix_from_demands`` of the pods that ``counts`` (``count_shapes``) counted."""
    _check_coverage(coverage)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept: list[tuple[PodShape, int]] = []
    covered = 0
    for shape, n in ranked:
        if covered >= coverage * total:
            break
        kept.append((shape, n))
        covered += n
    if not any(g or m for (g, m, _, _), _ in kept):
        return DEFAULT_POD_MIX
    return tuple(
        MixEntry(gpus=g, gpu_milli=m, weight=float(n), cpu_milli=c, products=p)
        for (g, m, c, p), n in sorted(kept)
    )


def _check_coverage(coverage: float) -> None:
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"the pod mix covers a share of the pods in (0, 1], not {coverage}")


def mix_distance(a: Sequence[MixEntry], b: Sequence[MixEntry]) -> float:
    """How far apart two mixes are, 0..1: the share of weight that would have to move
    from one pod size to another to turn ``a`` into ``b`` (total variation distance).

    Fragmentation is a weighted mean over the mix, so it cannot move by more than this
    share of a node's free capacity; a tail size that enters or leaves the mix at the
    coverage cut moves it by that size's small share only.
    """

    def shares(mix: Sequence[MixEntry]) -> dict[PodShape, float]:
        total = sum(e.weight for e in mix)
        out: dict[PodShape, float] = {}
        for e in mix:
            shape = (e.gpus, e.gpu_milli, e.cpu_milli, e.products)
            out[shape] = out.get(shape, 0.0) + e.weight / total
        return out

    sa, sb = shares(a), shares(b)
    return 0.5 * sum(abs(sa.get(s, 0.0) - sb.get(s, 0.0)) for s in sa.keys() | sb.keys())


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """Everything a decision reads besides the snapshot, the pod and the time."""

    levels: tuple[TopologyLevel, ...] = (HOSTNAME_LEVEL,)
    """Topology levels from the widest (block) to the narrowest (hostname)."""
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    islands_required: bool = True
    """A whole-GPU pod that fits in one NVLink island must get one island. False makes
    it a preference (scored by island fit) instead of a filter."""
    pod_mix: tuple[MixEntry, ...] = DEFAULT_POD_MIX
    cpu_stranding: float = 0.2
    """How much of a GPU that the node's CPU can no longer serve counts as a fragment
    for a pod size: a node with four free GPUs and 38.5 cores holds three and a half
    11-core pods by CPU, so half of its fourth GPU is left to pods that ask for less
    CPU; that half counts this much of a fragment (0: only a node without CPU for even
    one such pod loses its GPUs, FGD's measure; 1: all of it). The default 0.2 gave the
    largest smallest margin over FGD's published figures on the openb traces with the
    smallest margins (multigpu30, gpushare40), on seeds 52-81: not the seeds 42-51
    that ``loadtest.placement`` reports. Anywhere in 0.15-0.35 is within 0.04 of it."""
    normalize_scores: bool = True
    """Spread ``/prioritize`` answers over 1-10 across the candidates (best = 10): the
    wire's eleven values are too coarse to carry fragmentation differences otherwise."""
    choose_in_filter: bool = False
    """``/filter`` answers the one node the pod should go to rather than every node it
    fits (``decide.choose``), unless the pod states a preference only kube-scheduler's
    scoring weighs. kube-scheduler binds a pod with one feasible node there without
    scoring it: no ``/prioritize`` call, no in-tree scores, and the node is Tessera's
    best exactly, not its best up to the wire's eleven score values."""

    def __post_init__(self) -> None:
        names = [level.name for level in self.levels]
        labels = [level.node_label for level in self.levels]
        if len(set(names)) != len(names) or len(set(labels)) != len(labels):
            raise ValueError(f"topology levels must have distinct names and labels: {names}")
        if not any(entry.uses_gpus for entry in self.pod_mix):
            raise ValueError("the pod mix needs at least one pod size with GPUs")
        if not 0.0 <= self.cpu_stranding <= 1.0:
            raise ValueError(f"cpu_stranding is in 0..1, not {self.cpu_stranding}")

    @property
    def level_labels(self) -> tuple[str, ...]:
        """The node labels of the levels: what ``cluster.convert.nodes.node_from_json`` reads."""
        return tuple(level.node_label for level in self.levels)

    def level(self, name: str) -> TopologyLevel | None:
        """The level that ``tessera.dev/topology`` means by ``name``, if any."""
        for level in self.levels:
            if level.answers_to(name):
                return level
        return None


def levels_from_labels(labels: Sequence[str]) -> tuple[TopologyLevel, ...]:
    """Levels named by their labels' name parts (``example.com/rack`` is ``rack``)."""
    return tuple(TopologyLevel(level_short_name(label), label) for label in labels)
