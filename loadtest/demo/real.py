"""``python -m loadtest demo --real``: the demo's job stream on the real stack.

Layer: I/O (drives a running ``E2ECluster`` through ``KubeApi``; time from the injected
``Clock``). Where the embedded demo plays Kueue, kube-scheduler and the kubelets itself,
here it only creates the stream's Jobs through kube-apiserver (both webhooks review them)
and reads back what the real Kueue, kube-scheduler with Tessera's extender, and the job
controller did with them. The one part it plays is the kubelet of its fake nodes: a
``FakeKubelet`` that starts each bound pod and ends it after the run time the stream drew
for its job. Must not admit, unsuspend or place anything, nor decide what is measured
(``loadtest.report.real`` does).

Setup, on a stack that ``loadtest.stack.cluster.bring_up`` started (the CLI's, with no
nodes of its own, or the e2e suite's): the teams' namespaces, the example queue policy
(``manifests/examples``, quotas scaled to the fleet) with the H100 flavors in topology
mode A (``tessera.dev/topology-name``: Tessera's webhook and extender keep gangs in a rack)
or mode B (``spec.topologyName``: Kueue's topology-aware scheduling assigns the hosts),
the HGX fleet of ``loadtest.inputs.fleet`` as fake nodes, and their kubelet. ``cleanup`` removes
the jobs, pods and nodes again, so a shared stack is left as it was found.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels
from cluster.clock import Clock
from loadtest.inputs import fleet as hgx
from loadtest.report.real import JobRecord, PodRecord, RealRun, Sample
from loadtest.sim import scenario
from loadtest.stack.cluster import E2ECluster, create_namespaces
from loadtest.stack.fleet import CAPACITY, POOL, FakeNode, create_nodes
from loadtest.stack.jobs import to_yaml
from loadtest.stack.kubeapi import ApiError
from loadtest.stack.kubelet import FakeKubelet
from loadtest.stack.placements import Placement, gpu_conflicts, parse_indices

TOPOLOGIES: Final = ("tessera", "kueue")
"""Mode A (Tessera decides rack/block locality) and mode B (Kueue's TAS does)."""
TAS_FLAVORS: Final = frozenset({"h100-reserved", "h100-spot"})
"""The flavors of the gang-carrying queues (nlp, cv) that mode B hands to Kueue's TAS."""
DEMO_POOL: Final = "demo"
DEMO_CAPACITY: Final = "demo"
"""The stack's capacity label on the demo's nodes: no e2e flavor selects them."""
SAMPLE_EVERY_S: Final = 0.5
ENDED: Final = ("Succeeded", "Failed")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RealSpec:
    fleet: hgx.FleetSpec
    stream: hgx.StreamSpec
    drain_s: float
    """After the last arrival, how long to wait for the last jobs to complete."""
    seed: int = 1
    topology: str = "tessera"


def real_spec(*, short: bool = False, seed: int = 1, topology: str = "tessera") -> RealSpec:
    """The demo's stream, smaller: a real control plane on 2 cores creates, admits and
    binds a few pods a second, not the embedded demo's hundreds."""
    if short:
        # CI: a handful of jobs, gangs among them (seed 1), quick pods.
        return RealSpec(
            fleet=hgx.FleetSpec(nodes=8, unhealthy_gpus=1),
            stream=hgx.StreamSpec(
                rate=2.0, duration_s=5.0, median_run_s=1.0, max_run_s=3.0, bad_jobs=1
            ),
            drain_s=40.0,
            seed=seed,
            topology=topology,
        )
    return RealSpec(
        fleet=hgx.FleetSpec(nodes=16),
        stream=hgx.StreamSpec(rate=2.0, duration_s=45.0, median_run_s=5.0, max_run_s=20.0),
        drain_s=120.0,
        seed=seed,
        topology=topology,
    )


def demo_nodes(nodes: Sequence[Mapping[str, Any]]) -> tuple[FakeNode, ...]:
    """The HGX fleet's Node objects as the stack's fake nodes, labels and taints kept."""
    out = []
    for node in nodes:
        meta = node["metadata"]
        annotations = meta.get("annotations") or {}
        node_labels = dict(meta["labels"])
        node_labels[CAPACITY] = DEMO_CAPACITY
        drain = annotations.get(labels.DRAIN_AFTER)
        out.append(
            FakeNode(
                name=meta["name"],
                pool=DEMO_POOL,
                rack=node_labels[hgx.RACK_LABEL],
                block=node_labels[hgx.BLOCK_LABEL],
                gpus=int(node["status"]["allocatable"][labels.GPU_RESOURCE]),
                islands=annotations.get(labels.NVLINK_ISLANDS, "0-3,4-7"),
                unhealthy=annotations.get(labels.UNHEALTHY_GPUS),
                drain_in=None if drain is None else hgx.FleetSpec().drain_in,
                extra_labels=node_labels,
                taints=tuple((node.get("spec") or {}).get("taints") or ()),
            )
        )
    return tuple(out)


def mode_policy(policy: Sequence[Mapping[str, Any]], topology: str) -> list[dict[str, Any]]:
    """The example policy in one topology mode: in mode B the gang-carrying queues' H100
    flavors name their Topology in ``spec.topologyName`` (Kueue's TAS) instead of
    Tessera's annotation."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology {topology!r}: one of {', '.join(TOPOLOGIES)}")
    out = [copy.deepcopy(dict(obj)) for obj in policy]
    if topology == "tessera":
        return out
    for obj in out:
        if obj.get("kind") != "ResourceFlavor" or obj["metadata"]["name"] not in TAS_FLAVORS:
            continue
        annotations = obj["metadata"].get("annotations") or {}
        name = annotations.pop(labels.FLAVOR_TOPOLOGY, None)
        if name is not None:
            obj["spec"]["topologyName"] = name
    return out


def _phase(pod: Mapping[str, Any]) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def _true(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            found: dict[str, Any] = c
            return found
    return None


def _limits(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for container in pod["spec"].get("containers") or []:
        value = ((container.get("resources") or {}).get("limits") or {}).get(resource)
        total += int(value or 0)
    return total


class RealDemo:
    """One run of the stream on ``cluster``: ``setup``, ``drive``, ``cleanup``."""

    def __init__(
        self,
        cluster: E2ECluster,
        spec: RealSpec,
        clock: Clock,
        *,
        quota_nominal_gpus: Callable[[scenario.Prepared], int],
        progress: Progress | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cluster, self.api, self.spec, self.clock = cluster, cluster.api, spec, clock
        self.progress, self.sleep = progress, sleep
        prepared = scenario.prepare(
            scenario.RunSpec(fleet=spec.fleet, stream=spec.stream, seed=spec.seed), clock.now()
        )
        self.prepared = prepared
        self.nodes = demo_nodes(prepared.nodes)
        self.by_name = {n.name: n for n in self.nodes}
        self.policy = mode_policy(prepared.policy, spec.topology)
        self.namespaces = sorted({t.namespace for t in hgx.TEAMS})
        self.run_s = {f"{j.namespace}/{j.name}": j.run_s for j in prepared.jobs}
        self.healthy = {
            n.name: frozenset(range(n.gpus))
            - frozenset(parse_indices(n.unhealthy) if n.unhealthy else ())
            for n in self.nodes
        }
        islands = {
            n.name: tuple(frozenset(parse_indices(part)) for part in n.islands.split(","))
            for n in self.nodes
        }
        self.result = RealRun(
            topology=spec.topology,
            nodes=len(self.nodes),
            gpus_total=sum(n.gpus for n in self.nodes),
            islands=islands,
            quota_nominal_gpus=quota_nominal_gpus(prepared),
            sample_every_s=SAMPLE_EVERY_S,
        )
        self.kubelet = FakeKubelet(self.api, list(self.by_name), clock, lifetime=self._lifetime)
        self._problems: set[str] = set()
        self._started = 0.0
        self._lock = threading.Lock()
        """Held by the watch threads while they record, and by the driver to read."""
        self._live_pods: dict[str, dict[str, Any]] = {}
        """``namespace/name`` → the pod as last watched, until it is deleted."""
        self._failure: Exception | None = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        missing = [ns for ns in self.namespaces if not self._exists(f"/api/v1/namespaces/{ns}")]
        create_namespaces(self.cluster.plane, self.api, missing)
        self.cluster.kubectl("apply", "-f", "-", stdin=to_yaml(*self.policy))
        create_nodes(self.api, self.nodes, self.clock)
        queues = [o["metadata"]["name"] for o in self.policy if o.get("kind") == "ClusterQueue"]
        self.api.wait(
            f"Kueue to make ClusterQueues {', '.join(queues)} active",
            lambda: True if all(self._active(q) for q in queues) else None,
            timeout=60,
        )
        first = next(j for j in self.prepared.jobs if not j.kind.startswith("bad-"))
        self.api.wait(
            "the webhook to know the teams' queues",
            lambda: self._suspends(first.job),
            timeout=60,
        )
        self.kubelet.start()

    def cleanup(self) -> None:
        self.kubelet.stop()
        for ns in self.namespaces:
            for kind in ("jobs", "pods"):
                self.cluster.kubectl("delete", kind, "--all", "-n", ns, "--wait=false")

        def gone() -> bool | None:
            left = [
                item
                for ns in self.namespaces
                for kind in ("apis/batch/v1", "api/v1")
                for item in self.api.items(
                    f"/{kind}/namespaces/{ns}/{'jobs' if 'batch' in kind else 'pods'}"
                )
            ]
            if left:
                # pods on the demo's nodes: nobody else confirms their deletion now
                for pod in left:
                    if pod.get("kind", "Pod") == "Pod" and pod["metadata"].get("deletionTimestamp"):
                        self._force_delete(pod)
                return None
            return True

        self.api.wait("the demo's jobs and pods to be gone", gone, timeout=60)
        self.cluster.kubectl("delete", "nodes", "-l", f"{POOL}={DEMO_POOL}", "--wait=false")

    def _force_delete(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _exists(self, path: str) -> bool:
        try:
            self.api.get(path)
        except ApiError:
            return False
        return True

    def _active(self, queue: str) -> bool:
        cq = self.api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{queue}")
        return _true(cq, "Active") is not None

    def _suspends(self, job: Mapping[str, Any]) -> bool | None:
        ns = job["metadata"]["namespace"]
        try:
            created = self.api.request(
                "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job, query={"dryRun": "All"}
            )
        except ApiError:
            return None
        return True if created["spec"].get("suspend") is True else None

    def _lifetime(self, pod: Mapping[str, Any]) -> float | None:
        """The job's drawn run time, counted once all its pods run: a gang's members wait
        for each other (a training job's ranks meet before they start), so one member
        never completes alone while its peers cannot be placed."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{(meta.get('labels') or {}).get(labels.JOB_NAME)}"
        record = self.result.jobs.get(key)
        if record is None or record.bound_s is None:
            return None
        return self.run_s.get(key)

    # ------------------------------------------------------------------ the run

    def now_s(self) -> float:
        return self.clock.monotonic() - self._started

    def drive(self) -> RealRun:
        """Create the stream's jobs at their times, sample until all are done (or the
        drain time is over), and return what was seen. Jobs, Kueue's Workloads and pods
        are watched, so each change is timed when kube-apiserver reports it (a poll of
        all of them per sample took most of a second on a loaded 2-core machine)."""
        jobs = sorted(self.prepared.jobs, key=lambda j: j.at_s)
        arrivals = self.spec.stream.duration_s
        self._started = self.clock.monotonic()
        stopping = threading.Event()
        watchers = [
            threading.Thread(
                target=self._watch, args=(path, handle, stopping), name=f"demo-watch-{n}"
            )
            for n, (path, handle) in enumerate(
                (
                    ("/apis/batch/v1/jobs", self._on_job),
                    ("/apis/kueue.x-k8s.io/v1beta2/workloads", self._on_workload),
                    ("/api/v1/pods", self._on_pod),
                )
            )
        ]
        for watcher in watchers:
            watcher.start()
        try:
            next_job, next_sample = 0, 0.0
            while True:
                now = self.now_s()
                while next_job < len(jobs) and jobs[next_job].at_s <= now:
                    self._create(jobs[next_job])
                    next_job += 1
                if now >= next_sample:
                    self._sample(now)
                    while next_sample <= now:  # a late sample is not made up for
                        next_sample += SAMPLE_EVERY_S
                    if next_job == len(jobs) and (
                        self._all_done() or now > arrivals + self.spec.drain_s
                    ):
                        break
                upcoming = [next_sample]
                if next_job < len(jobs):
                    upcoming.append(jobs[next_job].at_s)
                self.sleep(max(0.0, self._started + min(upcoming) - self.clock.monotonic()))
                if self._failure is not None:
                    raise self._failure
        finally:
            stopping.set()
            for watcher in watchers:
                watcher.join(timeout=15)
        self.result.arrivals_s = max(arrivals, jobs[-1].at_s if jobs else 0.0)
        self.result.duration_s = self.now_s()
        self.result.double_booked = sorted(self._problems)
        return self.result

    def _watch(
        self,
        path: str,
        handle: Callable[[str, dict[str, Any], float], None],
        stopping: threading.Event,
    ) -> None:
        try:
            for kind, obj in self.api.events(path, stopping):
                if obj.get("metadata", {}).get("namespace") not in self.namespaces:
                    continue
                with self._lock:
                    handle(kind, obj, self.now_s())
        except Exception as exc:
            # handed to the driver, which raises it: a run without its watches measures nothing
            self._failure = exc

    def _create(self, spec: hgx.JobSpec) -> None:
        job = spec.job
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        record = JobRecord(
            namespace=ns,
            name=name,
            kind=spec.kind,
            local_queue=f"{ns}/{meta['labels'][labels.QUEUE_NAME]}",
            pods=int(job["spec"]["parallelism"]),
            run_s=spec.run_s,
            created_s=self.now_s(),
        )
        with self._lock:
            # before the POST: the watches may report the job before it returns
            self.result.jobs[f"{ns}/{name}"] = record
        try:
            self.api.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
        except ApiError as exc:
            if exc.status >= 500:
                raise
            # the server's message is what a user sees from kubectl
            record.denied = str(exc).split(": HTTP ", 1)[-1]

    def _all_done(self) -> bool:
        with self._lock:
            return all(
                j.denied is not None or j.finished_s is not None for j in self.result.jobs.values()
            )

    # ------------------------------------------------------------------ what is seen

    def _on_job(self, kind: str, job: dict[str, Any], at: float) -> None:
        record = self.result.jobs.get(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
        if record is None or record.finished_s is not None or kind == "DELETED":
            return
        if _true(job, "Complete"):
            record.finished_s = at
        elif _true(job, "Failed"):
            record.finished_s, record.failed = at, True

    def _on_workload(self, kind: str, workload: dict[str, Any], at: float) -> None:
        owner = next(
            (
                o["name"]
                for o in workload["metadata"].get("ownerReferences") or []
                if o.get("kind") == "Job"
            ),
            None,
        )
        record = self.result.jobs.get(f"{workload['metadata']['namespace']}/{owner}")
        if record is None or kind == "DELETED":
            return
        evicted = _true(workload, "Evicted")
        if evicted is not None:
            record.evictions.add(str(evicted.get("reason", "")))
        admission = workload.get("status", {}).get("admission")
        if admission and record.admitted_s is None:
            record.admitted_s = at
            flavors = (admission.get("podSetAssignments") or [{}])[0].get("flavors") or {}
            record.flavor = str(
                flavors.get(labels.GPU_RESOURCE) or next(iter(flavors.values()), "")
            )

    def _on_pod(self, kind: str, pod: dict[str, Any], at: float) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        job = (meta.get("labels") or {}).get(labels.JOB_NAME, "")
        if kind == "DELETED":
            self._live_pods.pop(key, None)
            return
        self._live_pods[key] = pod
        record = self.result.pods.get(key)
        if record is None:
            record = self.result.pods[key] = PodRecord(
                namespace=meta["namespace"],
                name=meta["name"],
                job=job,
                gpus=_limits(pod, labels.GPU_RESOURCE),
                milli=_limits(pod, labels.GPU_MILLI_RESOURCE),
            )
        node = pod["spec"].get("nodeName") or ""
        if not node or record.bound_s is not None:
            return
        raw = (meta.get("annotations") or {}).get(labels.GPU_INDICES, "")
        record.node, record.bound_s = node, at
        record.indices = tuple(parse_indices(raw)) if raw else ()
        fake = self.by_name.get(node)
        record.rack = fake.rack if fake is not None else ""
        owner = self.result.jobs.get(f"{meta['namespace']}/{job}")
        if owner is None or owner.bound_s is not None:
            return
        bound = [
            other["spec"]["nodeName"]
            for other in self._live_pods.values()
            if other["metadata"]["namespace"] == meta["namespace"]
            and (other["metadata"].get("labels") or {}).get(labels.JOB_NAME) == job
            and other["spec"].get("nodeName")
            and not other["metadata"].get("deletionTimestamp")
            and _phase(other) != "Failed"
        ]
        if len(bound) >= owner.pods:
            owner.bound_s = at
            owner.racks = tuple(self.by_name[n].rack if n in self.by_name else "" for n in bound)

    def _sample(self, at: float) -> None:
        with self._lock:
            pods = list(self._live_pods.values())
            waiting: dict[str, int] = {}
            for job in self.result.jobs.values():
                if job.denied is None and job.admitted_s is None:
                    waiting[job.local_queue] = waiting.get(job.local_queue, 0) + 1
            done = sum(j.finished_s is not None for j in self.result.jobs.values())
            created = len(self.result.jobs)
        live = [p for p in pods if p["spec"].get("nodeName") and _phase(p) not in ENDED]
        pending = sum(
            1
            for p in pods
            if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        )
        placements = [Placement.of(p) for p in live]
        self._problems.update(gpu_conflicts(placements, self.by_name))
        used: dict[str, set[int]] = {}
        for p in placements:
            used.setdefault(p.node, set()).update(p.indices)
        free = whole = 0
        for name, healthy in self.healthy.items():
            idle = healthy - used.get(name, set())
            free += len(idle)
            whole += sum(len(island) for island in self.result.islands[name] if island <= idle)
        allocated = sum(p.gpus + p.gpu_milli / 1000 for p in placements)
        self.result.samples.append(
            Sample(
                at_s=at,
                gpus_allocated=allocated,
                pods_running=len(live),
                pods_pending=pending,
                jobs_waiting=waiting,
                free_gpus=free,
                free_in_whole_islands=whole,
            )
        )
        if self.progress is not None:
            total = max(self.result.gpus_total, 1)
            bar = "#" * int(30 * allocated / total)
            self.progress(
                f"{at:6.1f} s  jobs {created:>4} done {done:>4}  waiting "
                f"{sum(waiting.values()):>3}  running {len(live):>4}  "
                f"GPUs [{bar:.<30}] {100 * allocated / total:5.1f}%"
            )
