"""The cluster cache: one writer, immutable snapshots for every reader.

Layer: STATE. Synchronous, single-threaded and lock-free by design: the informer task
(watch events) and the extender's bind (``assume``/``forget``) are the only writers, all
on one event loop, and readers take a ``Snapshot`` and decide with no ``await`` in
between. Must not do I/O, must not use asyncio, threads or locks, and must not read the
time except through the injected ``Clock`` (for assumption TTLs).

What it keeps, and why:

* nodes as the watch reports them, and the same nodes with every allocation applied;
  a change rebuilds only the node it touches, so the other ``NodeState`` objects are
  shared between snapshots (copy-on-write);
* GPU pods: the watch's record of each, plus pods assumed by bind that the watch has
  not shown yet; terminal pods free their GPUs. Of a pod without GPUs only its node and
  CPU request are kept: a node's ``cpu_requested_milli`` counts every pod on it, since
  CPU that other pods took can leave free GPUs without the CPU to use them;
* the promises of the reservations the extender holds (``promise``), per node: a node
  whose promises change is logged as changed, so that no answer kept by its name
  outlives them;
* an allocation per bound or assumed pod. The watch wins over an assumption as soon as
  it shows the pod bound; a pod bound without ``tessera.dev/gpu-indices`` is given GPUs
  by ``pick_gpus`` so that per-GPU accounting stays whole. Allocations survive the
  deletion of their node, so a node that comes back is accounted as before.

GPU accounting is exact: ``assume`` re-checks against everything bound and assumed and
raises ``AllocationConflict`` rather than give one GPU (or more than 1000 milli of it) to
two pods. If the watch itself reports an over-commitment (a foreign scheduler, a restart
mid-bind), the cache counts it, clamps free milli at 0 and records a problem.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from cluster import logs
from cluster.accounting import GpuPool, account_node, holders
from cluster.cache_records import (
    Assumption,
    GangIndex,
    NodeSlot,
    ProductCounters,
    ProductTotals,
    gang_of,
    placement,
)
from cluster.clock import Clock
from cluster.labels import GPU_INDICES
from cluster.model import Allocation, NodeName, NodeState, PodInfo, PodKey, Promise
from cluster.sharded import CowMap, shard_of
from cluster.snapshot import NodeChangeLog, Snapshot, gpus_needed, indices_match

log = logging.getLogger(__name__)


class AllocationConflict(Exception):
    """``assume`` would over-allocate: the message names the GPU and who holds it."""


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """What a metrics endpoint reports about the cache; the last four are running totals."""

    generation: int
    nodes: int
    pods: int
    bound: int
    assumed: int
    problems: int
    products: Mapping[str, ProductCounters]
    assumptions_confirmed: int
    assumptions_expired: int
    assumptions_forgotten: int
    assume_conflicts: int


class ClusterCache:
    """Nodes and GPU pods from the watch, assumptions from bind, snapshots for readers."""

    def __init__(self, clock: Clock, assume_ttl_s: float = 30.0) -> None:
        self._clock = clock
        self._ttl = assume_ttl_s
        self._generation = 0
        self._changed = False
        # per node name: the node as reported, the pods on it, its problems
        self._slots: dict[NodeName, NodeSlot] = {}
        # nodes with allocations applied (what snapshots show), by shard, copied on write
        # like the pods: one bind changes one node, and a snapshot after it then costs a
        # shard, not a copy of every node (~40 us at 5,000)
        self._nodes: CowMap[NodeName, NodeState] = CowMap()
        # the watch's GPU pods, plus assumed pods the watch has not shown (_assume_only)
        self._pods: CowMap[PodKey, PodInfo] = CowMap()
        self._assume_only: set[PodKey] = set()
        self._assumed: dict[PodKey, Assumption] = {}
        self._assumed_view: frozenset[PodKey] | None = frozenset()
        # derived: allocations, and the gangs of the pods that hold one
        self._allocs: CowMap[PodKey, Allocation] = CowMap()
        self._gangs = GangIndex()
        # the node and CPU of each pod without GPUs (kept for nothing else)
        self._cpu_only: dict[PodKey, tuple[NodeName, int]] = {}
        self._pod_problems: dict[PodKey, str] = {}
        self._dirty_nodes: dict[NodeName, None] = {}
        self._products = ProductTotals()
        self._gpu_pool = GpuPool()
        self._totals = {"confirmed": 0, "expired": 0, "forgotten": 0, "conflicts": 0}
        self._promises: Mapping[NodeName, tuple[Promise, ...]] = MappingProxyType({})
        self._node_log = NodeChangeLog()
        self._snapshot = Snapshot(node_log=self._node_log)

    # ------------------------------------------------------------------ readers

    @property
    def generation(self) -> int:
        """Goes up by one for every write that changed what a snapshot would show."""
        return self._generation

    def snapshot(self) -> Snapshot:
        """The current state; the same object until the generation changes."""
        if self._snapshot.generation != self._generation:
            if self._assumed_view is None:
                self._assumed_view = frozenset(self._assumed)
            self._snapshot = Snapshot(
                generation=self._generation,
                node_log=self._node_log,
                nodes=self._nodes.freeze(),
                pods=self._pods.freeze(),
                allocations=self._allocs.freeze(),
                gangs=self._gangs.freeze(),
                assumed=self._assumed_view,
                promises=self._promises,
            )
        return self._snapshot

    @property
    def problems(self) -> tuple[str, ...]:
        """Accounting problems right now: over-committed GPUs, unusable GPU indices."""
        found = [p for name in sorted(self._slots) for p in self._slots[name].problems]
        found += [self._pod_problems[key] for key in sorted(self._pod_problems)]
        return tuple(found)

    def counters(self) -> CacheCounters:
        return CacheCounters(
            generation=self._generation,
            nodes=len(self._nodes),
            pods=len(self._pods),
            bound=len(self._allocs) - len(self._assumed),
            assumed=len(self._assumed),
            problems=sum(len(slot.problems) for slot in self._slots.values())
            + len(self._pod_problems),
            products=self._products.counters(),
            assumptions_confirmed=self._totals["confirmed"],
            assumptions_expired=self._totals["expired"],
            assumptions_forgotten=self._totals["forgotten"],
            assume_conflicts=self._totals["conflicts"],
        )

    # ------------------------------------------------------------------ nodes

    def replace_nodes(self, nodes: Iterable[NodeState]) -> None:
        """A relist of nodes: those not listed are deleted (their pods keep allocations)."""
        fresh = {node.name: node for node in nodes}
        for name, slot in self._slots.items():
            if slot.base is not None and name not in fresh:
                slot.base = None
                self._dirty_nodes[name] = None
        for node in fresh.values():
            self._put_node(node)
        self._flush()

    def upsert_node(self, node: NodeState) -> None:
        self._put_node(node)
        self._flush()

    def delete_node(self, name: NodeName) -> None:
        slot = self._slots.get(name)
        if slot is not None and slot.base is not None:
            slot.base = None
            self._dirty_nodes[name] = None
        self._flush()

    def _put_node(self, node: NodeState) -> None:
        slot = self._slot(node.name)
        old = slot.base
        if old == node:
            return
        if node.problems and (old is None or old.problems != node.problems):
            log.warning(
                "node values ignored",
                extra=logs.fields(node=node.name, problems=list(node.problems)),
            )
        slot.base = node
        self._dirty_nodes[node.name] = None

    def _slot(self, name: NodeName) -> NodeSlot:
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = NodeSlot()
        return slot

    def promise(self, promises: Mapping[NodeName, tuple[Promise, ...]]) -> None:
        """The reservations' promises from now on, per node (all of them, replacing
        the last). The nodes whose promises changed are logged as changed."""
        old = self._promises
        changed = [n for n in old.keys() | promises.keys() if old.get(n) != promises.get(n)]
        if not changed:
            return
        self._promises = MappingProxyType(dict(promises))
        for name in sorted(changed):
            self._node_log.record(self._generation + 1, name)
        self._changed = True
        self._flush()

    # ------------------------------------------------------------------ pods (the watch)

    def replace_pods(self, pods: Iterable[PodInfo]) -> None:
        """A relist of pods: the watch's records are replaced wholesale.

        Assumptions survive unless the relist contradicts them: a pod listed as bound
        confirms (or overrides) its assumption, a pod listed as finished cancels it. A
        pod missing from the list keeps its assumption until the TTL: the list may have
        been taken before the pod appeared, and dropping a live assumption could hand
        its GPUs out twice.
        """
        fresh: dict[PodKey, PodInfo] = {}
        ended: dict[PodKey, str] = {}
        cpu_only: dict[PodKey, PodInfo] = {}
        for pod in pods:
            if pod.phase.terminal:
                if pod.key in self._assumed:
                    ended[pod.key] = pod.uid
            elif pod.demand.uses_gpu:
                fresh[pod.key] = pod
            else:
                cpu_only[pod.key] = pod
        for key in [k for k in self._cpu_only if k not in cpu_only]:
            self._set_cpu_only(key, None)
        for key, pod in cpu_only.items():
            self._set_cpu_only(key, pod)
        for key in self._pods.key_list():
            if key not in fresh and key not in self._assume_only:
                self._update(key, None, self._assumed.get(key))
        for key, uid in ended.items():
            if key not in fresh:
                self._end(key, uid)
        for pod in fresh.values():
            self._observe(pod)
        self._flush()

    def upsert_pod(self, pod: PodInfo) -> None:
        """A pod from the watch. Bound: it confirms (or overrides) any assumption."""
        if pod.phase.terminal or not pod.demand.uses_gpu:
            self._set_cpu_only(pod.key, None if pod.phase.terminal else pod)
            if pod.key in self._pods:
                self._end(pod.key, pod.uid)
            self._flush()
            return
        self._set_cpu_only(pod.key, None)
        self._observe(pod)
        self._flush()

    def delete_pod(self, key: PodKey, uid: str | None = None) -> None:
        """The pod is gone. With ``uid``, an assumption made for a newer pod of the same
        name (deleted and re-created) is kept."""
        self._set_cpu_only(key, None)
        if key in self._pods:
            self._end(key, uid or "")
        self._flush()

    def _set_cpu_only(self, key: PodKey, pod: PodInfo | None) -> None:
        """Count the CPU of a pod without GPUs on its node (``None``: it is gone); its
        node's free CPU is what the packing score weighs against the GPUs left."""
        placed = None if pod is None or pod.node is None else (pod.node, pod.demand.cpu_milli)
        old = self._cpu_only.get(key)
        if placed == old:
            return
        if old is not None:
            del self._cpu_only[key]
            self._add_cpu(old[0], -old[1])
        if placed is not None:
            self._cpu_only[key] = placed
            self._add_cpu(placed[0], placed[1])

    def _add_cpu(self, node: NodeName, cpu: int) -> None:
        if not cpu:
            return  # a pod that asks for no CPU changes nothing a reader sees
        self._slot(node).cpu_only += cpu
        self._dirty_nodes[node] = None

    def _observe(self, pod: PodInfo) -> None:
        key = pod.key
        assumption = self._assumed.get(key)
        if assumption is not None and pod.node is not None:
            self._totals["confirmed"] += 1
            if placement(pod, None) != (assumption.allocation.node, assumption.allocation):
                log.info(
                    "watch placed pod differently from its assumption",
                    extra=logs.fields(
                        pod=key,
                        assumed=f"{assumption.allocation.node}:{assumption.allocation}",
                        bound=f"{pod.node}:{','.join(map(str, pod.gpu_indices))}",
                    ),
                )
            assumption = None
        if assumption is self._assumed.get(key) and self._watch(key) == pod:
            return
        if pod.problems:
            old = self._pods.get(key)
            if old is None or old.problems != pod.problems:
                log.warning(
                    "pod annotations ignored",
                    extra=logs.fields(pod=key, problems=list(pod.problems)),
                )
        self._update(key, pod, assumption)

    def _end(self, key: PodKey, uid: str) -> None:
        """The watch says the pod ``uid`` finished or is gone."""
        assumption = self._assumed.get(key)
        if assumption is not None and not (
            uid and assumption.pod.uid and assumption.pod.uid != uid
        ):
            assumption = None
        self._update(key, None, assumption)

    # ------------------------------------------------------------------ bind

    def assume(self, pod: PodInfo, allocation: Allocation) -> None:
        """Count ``allocation`` for ``pod`` now, before the watch confirms the binding.

        Raises ``AllocationConflict`` when the GPUs are not free given everything bound
        and assumed, the node is unknown, or the pod is already bound or assumed
        elsewhere; ``ValueError`` when the allocation does not match the pod's demand.
        Re-assuming the same allocation only restarts its TTL.
        """
        key, demand = pod.key, pod.demand
        if not demand.uses_gpu:
            raise ValueError(f"pod {key} uses no GPU: nothing to assume")
        if allocation.milli_per_gpu != demand.milli_per_gpu or not indices_match(
            allocation.indices, demand
        ):
            raise ValueError(
                f"allocation {allocation.node}:{allocation} x {allocation.milli_per_gpu} milli "
                f"does not match pod {key}'s demand of {gpus_needed(demand)} GPU(s) x "
                f"{demand.milli_per_gpu} milli"
            )
        deadline = self._clock.monotonic() + self._ttl
        watch = self._watch(key)
        current = self._assumed.get(key)
        try:
            if watch is not None and watch.node is not None:
                raise AllocationConflict(f"pod {key} is already bound to node {watch.node}")
            if current is not None:
                if current.allocation == allocation:
                    self._assumed[key] = replace(current, deadline=deadline)
                    return
                held = current.allocation
                raise AllocationConflict(
                    f"pod {key} is already assumed on node {held.node} GPU(s) {held}; "
                    "forget it first"
                )
            self._check_free(key, allocation)
        except AllocationConflict:
            self._totals["conflicts"] += 1
            raise
        self._update(key, watch, Assumption(pod, allocation, deadline))
        self._flush()

    def forget(self, key: PodKey) -> bool:
        """Drop the assumption for ``key`` (bind failed); False if there was none."""
        if key not in self._assumed:
            return False
        self._totals["forgotten"] += 1
        self._update(key, self._watch(key), None)
        self._flush()
        return True

    def expire(self) -> list[PodKey]:
        """Drop assumptions older than the TTL that the watch never confirmed."""
        now = self._clock.monotonic()
        expired = [key for key, a in self._assumed.items() if a.deadline <= now]
        for key in expired:
            allocation = self._assumed[key].allocation
            log.warning(
                "assumption expired unconfirmed",
                extra=logs.fields(pod=key, node=allocation.node, gpus=str(allocation)),
            )
            self._update(key, self._watch(key), None)
        self._totals["expired"] += len(expired)
        self._flush()
        return expired

    def _check_free(self, key: PodKey, allocation: Allocation) -> None:
        name = allocation.node
        node = self._nodes.get(name)
        if node is None:
            raise AllocationConflict(f"node {name} is not in the cache")
        gpus = {gpu.index: gpu for gpu in node.gpus}
        for index in allocation.indices:
            gpu = gpus.get(index)
            if gpu is None:
                raise AllocationConflict(f"node {name} has no GPU {index}")
            if not gpu.healthy:
                raise AllocationConflict(f"GPU {index} on node {name} is unhealthy")
            if gpu.free_milli < allocation.milli_per_gpu:
                raise AllocationConflict(
                    f"GPU {index} on node {name} has {gpu.free_milli} milli free, pod {key} "
                    f"needs {allocation.milli_per_gpu}: held by {self._holders(name, index)}"
                )

    def _holders(self, name: NodeName, index: int) -> str:
        slot = self._slots.get(name)
        return holders(
            slot.pods if slot is not None else {}, index, self._allocs.get, self._assumed
        )

    # ------------------------------------------------------------------ derived state

    def _watch(self, key: PodKey) -> PodInfo | None:
        return None if key in self._assume_only else self._pods.get(key)

    def _update(self, key: PodKey, watch: PodInfo | None, assumption: Assumption | None) -> None:
        """Install the inputs for one pod and bring everything derived from them along."""
        i = shard_of(key)
        old_record = self._pods.get_at(i, key)
        old_watch = None if key in self._assume_only else old_record
        old_place = placement(old_watch, self._assumed.get(key))
        self._set_assumption(key, assumption)
        record = self._set_record(i, key, watch, assumption, old_record)
        if old_record is not None:
            old_gang, new_gang = gang_of(old_record), gang_of(record)
            if old_gang != new_gang and self._allocs.get_at(i, key) is not None:
                self._gangs.move(key, old_gang, new_gang)
        self._check_indices(key, watch)
        self._place(i, key, record, old_place, placement(watch, assumption))

    def _set_assumption(self, key: PodKey, assumption: Assumption | None) -> None:
        if assumption is None:
            if self._assumed.pop(key, None) is None:
                return
        elif self._assumed.get(key) is not assumption:
            self._assumed[key] = assumption
        else:
            return
        self._assumed_view = None
        self._changed = True

    def _set_record(
        self,
        i: int,
        key: PodKey,
        watch: PodInfo | None,
        assumption: Assumption | None,
        old_record: PodInfo | None,
    ) -> PodInfo | None:
        """The pod as snapshots show it: the watch's record, or the assumed pod while
        the watch has not shown it."""
        if watch is None and assumption is not None:
            self._assume_only.add(key)
            record: PodInfo | None = assumption.pod
        else:
            self._assume_only.discard(key)
            record = watch
        if record is None:
            if old_record is not None:
                self._pods.pop_at(i, key)
                self._changed = True
        elif record is not old_record:
            self._pods.set_at(i, key, record)
            self._changed = True
        return record

    def _check_indices(self, key: PodKey, watch: PodInfo | None) -> None:
        if (
            watch is not None
            and watch.node is not None
            and watch.gpu_indices
            and not indices_match(watch.gpu_indices, watch.demand)
        ):
            self._pod_problems[key] = (
                f"pod {key} has {GPU_INDICES}={','.join(map(str, watch.gpu_indices))}, which "
                f"does not fit its demand of {gpus_needed(watch.demand)} GPU(s): GPUs picked"
            )
        elif self._pod_problems:
            self._pod_problems.pop(key, None)

    def _place(
        self,
        i: int,
        key: PodKey,
        record: PodInfo | None,
        old_place: tuple[NodeName, Allocation | None] | None,
        new_place: tuple[NodeName, Allocation | None] | None,
    ) -> None:
        """Move the pod from the node it was counted on to the one it is on now."""
        if new_place == old_place:
            if new_place is not None and record is not None:
                # a new request of the same pod: counted, as before, at the node's next
                # accounting
                self._slots[new_place[0]].pods[key] = (new_place[1], record.demand.cpu_milli)
            return
        if old_place is not None:
            del self._slots[old_place[0]].pods[key]
            self._dirty_nodes[old_place[0]] = None
        if new_place is None:
            self._set_alloc(i, key, None)
            return
        name, allocation = new_place
        assert record is not None  # a placement comes from the watch or an assumption
        self._slot(name).pods[key] = (allocation, record.demand.cpu_milli)
        self._dirty_nodes[name] = None
        if allocation is not None:
            self._set_alloc(i, key, allocation)
        else:
            previous = self._allocs.get_at(i, key)
            if previous is not None and previous.node != name:
                self._set_alloc(i, key, None)
            # else: accounting keeps the previous GPUs if they are still free

    def _set_alloc(self, i: int, key: PodKey, allocation: Allocation | None) -> None:
        current = self._allocs.get_at(i, key)
        if current == allocation:
            return
        self._changed = True
        gang = gang_of(self._pods.get_at(i, key))
        if allocation is None:
            self._allocs.pop_at(i, key)
            self._gangs.move(key, gang, None)
        else:
            self._allocs.set_at(i, key, allocation)
            if current is None:
                self._gangs.move(key, None, gang)

    def _account(self, name: NodeName) -> None:
        """Recompute one node from its base and the pods on it (``account_node``)."""
        slot = self._slots.get(name)
        base = None if slot is None else slot.base
        if slot is None or base is None:
            self._set_node(name, None)
            if slot is not None:
                self._set_problems(name, slot, ())
            return
        accounted = account_node(
            base,
            slot.pods,
            slot.cpu_only,
            pod_of=self._pods.get,
            allocation_of=self._allocs.get,
            assumed=self._assumed,
            pool=self._gpu_pool,
        )
        for key, chosen in accounted.picked:
            self._set_alloc(shard_of(key), key, chosen)
        self._set_node(name, accounted.node)
        self._set_problems(name, slot, accounted.problems)

    def _set_node(self, name: NodeName, node: NodeState | None) -> None:
        old = self._nodes.get(name)
        if old is node:
            return
        if old is not None:
            self._products.add(old, -1)
        if node is not None:
            self._products.add(node, 1)
        if node is None:
            self._nodes.pop(name)
        else:
            self._nodes.set(name, node)
        self._changed = True
        self._node_log.record(self._generation + 1, name)  # the generation _flush makes

    def _set_problems(self, name: NodeName, slot: NodeSlot, problems: tuple[str, ...]) -> None:
        if problems != slot.problems:
            slot.problems = problems
            if problems:
                log.warning(
                    "gpu accounting problem", extra=logs.fields(node=name, problems=problems)
                )
        if slot.unused:
            del self._slots[name]

    def _flush(self) -> None:
        """Finish a write: account touched nodes, re-sort touched gangs, bump the
        generation if a reader could see a difference."""
        while self._dirty_nodes:
            name = next(iter(self._dirty_nodes))
            del self._dirty_nodes[name]
            self._account(name)
        self._gangs.flush()
        if self._changed:
            self._changed = False
            self._generation += 1
