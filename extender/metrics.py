"""The extender's Prometheus metrics, one registry per app (no process-global state).

Layer: I/O (exposition). Counts what the handlers report and reads the cache's counters
and a snapshot at scrape time; must not decide anything or change the cache.

Label sets are bounded: verbs and results are fixed words, a filter reason (free text
written for people, one per node) is counted under the filter it comes from
(``explain.reason_category``), never as itself, and the capacity figures are labelled by
GPU product, ResourceFlavor and topology level, which the cluster's admins name.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster.cache import CacheCounters
from cluster.model import MILLI_PER_GPU, NodeName, NodeState
from cluster.snapshot import Snapshot
from extender.capacity import GANG_GPUS, flavor_of, fragmented_gpus, node_figures
from extender.config import ExtenderConfig
from extender.decide import FilterOutcome
from extender.explain import Tallies, reason_category
from server.serving import GcPauses
from server.tally import Counts, Timings

# kube-scheduler waits on /filter and /prioritize inside its scheduling loop: resolve the
# sub-millisecond range; /bind adds an API round trip, hence the long tail.
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
)

_CATEGORIES_KEPT: Final = 4096
"""Reason texts whose category is remembered (most repeat; a few name a node)."""


class _CacheCollector(Collector):
    """Cache figures read at scrape time: nothing to keep in step on the hot path."""

    def __init__(
        self, counters: Callable[[], CacheCounters], ages: Callable[[], Mapping[str, float]]
    ) -> None:
        self._counters = counters
        self._ages = ages

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        ages = GaugeMetricFamily(
            "tessera_extender_cache_age_seconds",
            "Seconds since kube-apiserver was last heard on the watch of this resource "
            "(nodes, pods): a list, an event, a bookmark or a watch ended in due time. "
            "Past --max-cache-age the extender is not ready and refuses to filter and bind.",
            labels=("resource",),
        )
        for resource, age in self._ages().items():
            ages.add_metric((resource,), age)
        yield ages
        c = self._counters()
        yield _gauge("tessera_extender_nodes", "Nodes in the cache.", c.nodes)
        yield _gauge("tessera_extender_pods", "GPU pods in the cache, bound or not.", c.pods)
        yield _gauge(
            "tessera_extender_assumed_pods",
            "Pods bound by the extender that the watch has not shown bound yet.",
            c.assumed,
        )
        yield _gauge(
            "tessera_extender_cache_problems",
            "GPU accounting problems (over-committed GPUs, unusable gpu-indices).",
            c.problems,
        )
        yield _gauge("tessera_extender_cache_generation", "Cache writes so far.", c.generation)
        assumptions = CounterMetricFamily(
            "tessera_extender_assumptions",
            "Assumptions ended, by how: the watch confirmed, the TTL expired, bind forgot.",
            labels=("outcome",),
        )
        assumptions.add_metric(("confirmed",), c.assumptions_confirmed)
        assumptions.add_metric(("expired",), c.assumptions_expired)
        assumptions.add_metric(("forgotten",), c.assumptions_forgotten)
        yield assumptions
        yield CounterMetricFamily(
            "tessera_extender_assume_conflicts",
            "Assumptions the cache refused because the GPUs were taken.",
            value=c.assume_conflicts,
        )

        gpus = GaugeMetricFamily(
            "tessera_extender_gpus",
            "GPUs per product (nvidia.com/gpu.product) and state: total, healthy, "
            "allocated and free (in GPUs, shares as fractions), whole_free (unshared).",
            labels=("product", "state"),
        )
        fragmentation = GaugeMetricFamily(
            "tessera_extender_gpu_fragmentation_ratio",
            "Share of the free healthy GPU capacity that sits on partly used GPUs, where "
            "no whole-GPU pod can use it (0: none, 1: all of it).",
            labels=("product",),
        )
        for product, p in c.products.items():
            name = product or "unknown"
            # Allocations on GPUs that turned unhealthy are counted against the free
            # capacity too: an approximation, exact whenever no bound GPU went bad.
            free_milli = max(0, p.healthy_gpus * MILLI_PER_GPU - p.allocated_milli)
            whole_milli = p.whole_free_gpus * MILLI_PER_GPU
            for state, value in (
                ("total", p.gpus),
                ("healthy", p.healthy_gpus),
                ("allocated", p.allocated_milli / MILLI_PER_GPU),
                ("free", free_milli / MILLI_PER_GPU),
                ("whole_free", p.whole_free_gpus),
            ):
                gpus.add_metric((name, state), value)
            parts = max(0, free_milli - whole_milli)
            fragmentation.add_metric((name,), parts / free_milli if free_milli else 0.0)
        yield gpus
        yield fragmentation


_CAPACITY_STATES: Final = ("total", "allocated", "free", "unhealthy", "draining")


class _CapacityCollector(Collector):
    """GPUs per product and flavor, FGD fragmentation and the largest gang per level,
    counted from one snapshot when scraped (``extender.capacity``), never on a request.

    The sums are kept from one scrape to the next and corrected node by node: a node
    whose ``NodeState`` is the same object as at the last scrape (a node that changed is
    a new object) costs an identity check, one that changed is taken out of the sums
    and put back in. A new config or new flavors start the sums afresh. At 5,000 nodes a
    scrape is a pass of identity checks plus the nodes that changed.
    """

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        config: Callable[[], ExtenderConfig],
        flavors: Callable[[], Mapping[str, Mapping[str, str]]],
    ) -> None:
        self._snapshot = snapshot
        self._config = config
        self._flavors = flavors
        self._basis: tuple[ExtenderConfig, Mapping[str, Mapping[str, str]]] | None = None
        self._kept: dict[NodeName, _NodeKept] = {}
        self._groups: dict[tuple[str, str], list[float]] = {}
        """(product, flavor) → nodes, GPUs total, allocated, free, unhealthy, draining,
        fragmented."""
        self._domains: dict[tuple[str, str, str], int] = {}
        """(product, level, domain) → gang pods its nodes could start."""
        self._per_node: dict[str, Tally[int]] = {}
        """product → nodes by the gang pods each could start (for the best node)."""

    def _row(
        self, node: NodeState, config: ExtenderConfig, flavors: Mapping[str, Mapping[str, str]]
    ) -> _NodeKept:
        figures = node_figures(node, islands_required=config.islands_required)
        product = node.product or "unknown"
        return _NodeKept(
            node,
            (product, flavor_of(node, flavors)),
            (
                1.0,
                figures.gpus_total,
                figures.gpus_allocated,
                figures.gpus_free,
                figures.gpus_unhealthy,
                figures.gpus_total if figures.draining else 0,
                fragmented_gpus(node, config),
            ),
            tuple(
                (level.name, node.labels[level.node_label])
                for level in config.levels
                if level.name != "hostname" and level.node_label in node.labels
            ),
            figures.gang_pods,
        )

    def _apply(self, row: _NodeKept, sign: int) -> None:
        sums = self._groups.setdefault(row.group, [0.0] * len(row.sums))
        for i, amount in enumerate(row.sums):
            sums[i] += sign * amount
        if sums[0] <= 0:
            del self._groups[row.group]
        product = row.group[0]
        if row.gang_pods:
            for level, value in row.domains:
                key = (product, level, value)
                total = self._domains.get(key, 0) + sign * row.gang_pods
                if total:
                    self._domains[key] = total
                else:
                    self._domains.pop(key, None)
        counts = self._per_node.setdefault(product, Tally())
        counts[row.gang_pods] += sign
        if counts[row.gang_pods] <= 0:
            del counts[row.gang_pods]
            if not counts:
                del self._per_node[product]

    def _refresh(self) -> ExtenderConfig:
        config, flavors = self._config(), self._flavors()
        if self._basis is None or self._basis[0] is not config or self._basis[1] is not flavors:
            self._basis = (config, flavors)
            self._kept, self._groups, self._domains, self._per_node = {}, {}, {}, {}
        kept, fresh = self._kept, {}
        for node in self._snapshot().nodes.values():
            if not node.gpus:
                continue
            row = kept.pop(node.name, None)
            if row is None or row.node is not node:
                if row is not None:
                    self._apply(row, -1)
                row = self._row(node, config, flavors)
                self._apply(row, 1)
            fresh[node.name] = row
        for gone in kept.values():
            self._apply(gone, -1)
        self._kept = fresh
        return config

    def collect(self) -> Iterator[GaugeMetricFamily]:
        config = self._refresh()
        gpus = GaugeMetricFamily(
            "tessera_extender_capacity_gpus",
            "Whole GPUs per product, Kueue ResourceFlavor (by its nodeLabels; empty: none) "
            "and state: total; allocated (some pod holds some of it); free (healthy, no "
            "pod holds any of it); unhealthy (tessera.dev/unhealthy-gpus); draining (on "
            "nodes with a tessera.dev/drain-after time).",
            labels=("product", "flavor", "state"),
        )
        nodes = GaugeMetricFamily(
            "tessera_extender_capacity_nodes",
            "GPU nodes per product and flavor.",
            labels=("product", "flavor"),
        )
        fragmented = GaugeMetricFamily(
            "tessera_extender_gpu_fragmented_gpus",
            "Free GPU capacity, in GPUs, that the pod mix in use could not use (FGD's "
            "expected fragmentation, summed over the nodes).",
            labels=("product", "flavor"),
        )
        for (product, flavor), sums in sorted(self._groups.items()):
            for state, value in zip(_CAPACITY_STATES, sums[1:6], strict=True):
                gpus.add_metric((product, flavor, state), round(value))
            nodes.add_metric((product, flavor), round(sums[0]))
            # a sum corrected many times drifts in its last bits
            fragmented.add_metric((product, flavor), round(max(0.0, sums[6]), 6))
        yield gpus
        yield nodes
        yield fragmented
        gangs = GaugeMetricFamily(
            "tessera_extender_largest_gang_pods",
            f"Pods of {GANG_GPUS} whole GPUs (in one NVLink island where the filter requires "
            "it) that one domain of the topology level could start now, per product: the "
            "best domain; hostname is the best node, cluster all nodes. Cordoned and "
            "draining nodes count for none.",
            labels=("product", "level"),
        )
        best: dict[tuple[str, str], int] = {}
        for (product, level, _), pods in self._domains.items():
            best[(product, level)] = max(best.get((product, level), 0), pods)
        levels = [level.name for level in config.levels if level.name != "hostname"]
        for product, counts in sorted(self._per_node.items()):
            for level in levels:
                gangs.add_metric((product, level), best.get((product, level), 0))
            gangs.add_metric((product, "hostname"), max(counts))
            gangs.add_metric((product, "cluster"), sum(k * n for k, n in counts.items()))
        yield gangs


@dataclass(frozen=True, slots=True)
class _NodeKept:
    """One node's part of the sums, as it was added in."""

    node: NodeState
    group: tuple[str, str]
    sums: tuple[float, ...]
    domains: tuple[tuple[str, str], ...]
    gang_pods: int


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class ExtenderMetrics:
    def __init__(
        self,
        counters: Callable[[], CacheCounters],
        ages: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
        """``counters``: the cache's figures; ``ages``: seconds since each watch last
        heard from kube-apiserver, by resource (none for a cluster file)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counts(
            self.registry,
            "tessera_extender_decisions",
            "Requests answered, by verb and result (ok, error: HTTP 200 with Error, "
            "refused: bind said no before any API call, bad_request, not_ready, "
            "stale: the cache is older than --max-cache-age, shed: too late for "
            "kube-scheduler's httpTimeout, answered 504 undecided).",
            ("verb", "result"),
        )
        self.latency = Timings(
            self.registry,
            "tessera_extender_request_seconds",
            "Time from request to answer, per verb; /bind includes its API calls.",
            LATENCY_BUCKETS,
            ("verb",),
        )
        self.decision = Timings(
            self.registry,
            "tessera_extender_decision_seconds",
            "Decode, decide and encode (and for /bind: assume), without any await.",
            LATENCY_BUCKETS,
            ("verb",),
        )
        self.bind_api = Timings(
            self.registry,
            "tessera_extender_bind_api_seconds",
            "The binder's part of a /bind: post the Binding (which records the GPUs).",
            LATENCY_BUCKETS,
        )
        self.filter_nodes = Counts(
            self.registry,
            "tessera_extender_filter_nodes",
            "Candidate nodes judged by /filter: fit, failed (preemption may help), unresolvable.",
            ("result",),
        )
        self.filter_reasons = Counts(
            self.registry,
            "tessera_extender_filter_reasons",
            "Nodes filtered out, by the kind of reason (see reason_category).",
            ("reason",),
        )
        self.mix_sizes = Gauge(
            "tessera_extender_pod_mix_sizes",
            "Pod sizes (GPUs or share, CPU, products) in the mix that packing keeps free "
            "GPUs usable for.",
            registry=self.registry,
        )
        self.mix_pods = Gauge(
            "tessera_extender_pod_mix_pods",
            "GPU pods the pod mix in use was learned from (0: the built-in mix).",
            registry=self.registry,
        )
        self.mix_changes = Counter(
            "tessera_extender_pod_mix_changes",
            "Times a newly learned pod mix replaced the one in use.",
            registry=self.registry,
        )
        self.reservations = Gauge(
            "tessera_extender_reservations",
            "Waiting gangs that hold a reservation (extender.holds).",
            registry=self.registry,
        )
        self.reserved_nodes = Gauge(
            "tessera_extender_reserved_nodes",
            "Nodes a reservation holds for a waiting gang.",
            registry=self.registry,
        )
        self.reserved_idle = Counter(
            "tessera_extender_reserved_idle_gpu_hours",
            "GPU-hours held idle for reservations: healthy GPUs free on reserved nodes, "
            "over the time between two plans.",
            registry=self.registry,
        )
        self.backfilled = Counter(
            "tessera_extender_backfilled_pods",
            "Pods bound on a node reserved for another gang, their time limit ending "
            "before the reservation starts.",
            registry=self.registry,
        )
        self.registry.register(_CacheCollector(counters, ages))
        self.gc_pauses = GcPauses(self.registry, "tessera_extender")
        self._categories: dict[str, str] = {}

    def watch_capacity(
        self,
        snapshot: Callable[[], Snapshot],
        config: Callable[[], ExtenderConfig],
        flavors: Callable[[], Mapping[str, Mapping[str, str]]] = dict,
    ) -> None:
        """Count GPUs per product and flavor, fragmentation and the largest gangs from
        ``snapshot()`` at each scrape (``_CapacityCollector``)."""
        self.registry.register(_CapacityCollector(snapshot, config, flavors))

    def pod_mix(self, sizes: int, pods: int, *, changed: bool = True) -> None:
        """The mix in use: ``sizes`` pod sizes learned from ``pods`` GPU pods."""
        self.mix_sizes.set(sizes)
        self.mix_pods.set(pods)
        if changed:
            self.mix_changes.inc()

    def reserving(self, gangs: int, nodes: int, idle_gpu_hours: float) -> None:
        """After a plan: ``gangs`` hold reservations on ``nodes``, and GPUs were held
        idle for ``idle_gpu_hours`` since the last plan."""
        self.reservations.set(gangs)
        self.reserved_nodes.set(nodes)
        if idle_gpu_hours > 0:
            self.reserved_idle.inc(idle_gpu_hours)

    def answered(self, verb: str, result: str, seconds: float) -> None:
        self.requests.inc(verb, result)
        self.latency.observe(seconds, verb)

    def decided(self, verb: str, seconds: float) -> None:
        self.decision.observe(seconds, verb)

    def filtered(self, outcome: FilterOutcome, tallies: Tallies) -> None:
        """One ``/filter`` answer; ``tallies`` are its nodes per reason text
        (``Tallies.of(outcome.failed, outcome.unresolvable)``)."""
        if outcome.fits:
            self.filter_nodes.add(len(outcome.fits), "fit")
        if outcome.failed:
            self.filter_nodes.add(len(outcome.failed), "failed")
        if outcome.unresolvable:
            self.filter_nodes.add(len(outcome.unresolvable), "unresolvable")
        per_category: Tally[str] = Tally()
        categories = self._categories
        for reason, count in tallies.by_reason():
            category = categories.get(reason)
            if category is None:
                if len(categories) >= _CATEGORIES_KEPT:
                    categories.clear()
                category = categories[reason] = reason_category(reason)
            per_category[category] += count
        for category, count in per_category.items():
            self.filter_reasons.add(count, category)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
