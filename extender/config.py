"""What the extender's decisions depend on besides the cluster: levels, weights, pod mix.

Layer: PURE. Frozen values only: no settings parsing, no environment, no I/O. The
extender's settings (read at the root) build one ``ExtenderConfig``; tests build their
own. Invalid values raise ``ValueError`` at construction, so a decision never meets one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.labels import HOSTNAME
from cluster.model import MILLI_PER_GPU, PodDemand


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
        return level in (self.name, self.node_label, self.node_label.rsplit("/", 1)[-1])


HOSTNAME_LEVEL = TopologyLevel("hostname", HOSTNAME)


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Relative weights of the scorers; the combined score is their weighted mean."""

    packing: float = 10.0
    """Fragmentation-aware packing (FGD): keep what is free usable by the expected pods."""
    island_fit: float = 0.2
    """Best fit inside the node: the tightest NVLink island, or the tightest shared GPU.
    Small by default: packing already sees islands, and its differences are fractions
    of a point that a larger weight here would drown; this breaks its ties."""
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
    """A pod size the cluster expects, and how often: ``gpus`` whole GPUs or a share,
    with the CPU it asks for (a node without that much CPU cannot use its GPUs)."""

    gpus: int = 0
    gpu_milli: int = 0
    weight: float = 1.0
    cpu_milli: int = 0

    def __post_init__(self) -> None:
        whole, share = self.gpus > 0, 0 < self.gpu_milli < MILLI_PER_GPU
        if whole == share or self.gpus < 0 or self.weight <= 0 or self.cpu_milli < 0:
            raise ValueError(
                f"a pod size is whole GPUs or one share of 1-999 milli, "
                f"with a positive weight and no negative CPU: {self!r}"
            )


DEFAULT_POD_MIX: tuple[MixEntry, ...] = (
    MixEntry(gpu_milli=250, weight=1.0),
    MixEntry(gpu_milli=500, weight=2.0),
    MixEntry(gpus=1, weight=4.0),
    MixEntry(gpus=2, weight=1.0),
    MixEntry(gpus=4, weight=1.0),
    MixEntry(gpus=8, weight=1.0),
)
"""Used until a real mix is known: mostly single GPUs and halves, some large jobs."""


def mix_from_demands(demands: Iterable[PodDemand], max_entries: int = 32) -> tuple[MixEntry, ...]:
    """The pod mix of a workload (FGD's "typical pods"): its most frequent pod shapes.

    Shares are rounded to 10 milli and CPU to whole cores, so that a workload of many
    near-equal pods yields a few dozen entries (on the Alibaba openb traces the 32 most
    frequent cover 97 % of GPU pods). Pods without GPUs are left out: they cannot use
    any. An empty workload gives ``DEFAULT_POD_MIX``.
    """
    counts: dict[tuple[int, int, int], int] = {}
    for demand in demands:
        cpu = max(0, round(demand.cpu_milli, -3))
        if demand.gpus > 0:
            shape = (demand.gpus, 0, cpu)
        elif 0 < demand.gpu_milli < MILLI_PER_GPU:
            shape = (0, min(MILLI_PER_GPU - 1, max(10, round(demand.gpu_milli, -1))), cpu)
        else:
            continue
        counts[shape] = counts.get(shape, 0) + 1
    if not counts:
        return DEFAULT_POD_MIX
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:max_entries]
    return tuple(
        MixEntry(gpus=g, gpu_milli=m, weight=float(n), cpu_milli=c) for (g, m, c), n in sorted(top)
    )


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
    normalize_scores: bool = True
    """Spread ``/prioritize`` answers over 1-10 across the candidates (best = 10): the
    wire's eleven values are too coarse to carry fragmentation differences otherwise."""

    def __post_init__(self) -> None:
        names = [level.name for level in self.levels]
        labels = [level.node_label for level in self.levels]
        if len(set(names)) != len(names) or len(set(labels)) != len(labels):
            raise ValueError(f"topology levels must have distinct names and labels: {names}")
        if not self.pod_mix:
            raise ValueError("the pod mix needs at least one pod size")

    @property
    def level_labels(self) -> tuple[str, ...]:
        """The node labels of the levels: what ``cluster.convert.node_from_json`` reads."""
        return tuple(level.node_label for level in self.levels)

    def level(self, name: str) -> TopologyLevel | None:
        """The level that ``tessera.dev/topology`` means by ``name``, if any."""
        for level in self.levels:
            if level.answers_to(name):
                return level
        return None


def levels_from_labels(labels: Sequence[str]) -> tuple[TopologyLevel, ...]:
    """Levels named by their labels' name parts (``example.com/rack`` is ``rack``)."""
    return tuple(TopologyLevel(label.rsplit("/", 1)[-1], label) for label in labels)
