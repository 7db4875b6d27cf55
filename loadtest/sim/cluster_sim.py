"""The cluster around the two servers: kube-apiserver, Kueue, the Job controller,
kube-scheduler and the kubelets, played over the servers' real HTTP(S) endpoints.

Layer: I/O (one asyncio loop; time from the injected ``Clock``). The decisions it plays
come from the PURE modules: ``kueue`` (quota, FIFO, borrowing), ``scheduling`` (in-tree
fit and score combination), ``objects`` (reviews, patches, pods). Must not import the
servers' code: it only talks to them over the wire, so it measures what a cluster sees.

The flow for one job, as in a cluster:

1. *kube-apiserver*: at the job's arrival time (open loop: each review is sent at its
   intended time whatever the earlier ones are doing, and its latency is measured from
   that time) an AdmissionReview CREATE goes to the webhook over TLS; a denial is kept
   with its message, an admission's JSON patch is applied to give the stored Job.
2. *Kueue*: the suspended Job waits in its ClusterQueue until quota is free (own nominal
   quota, then borrowing in the cohort), FIFO; admission picks a flavor, writes its node
   labels as the template's ``nodeSelector`` and unsuspends the Job. That write is an
   UPDATE, so kube-apiserver sends the webhook an UPDATE review (``oldObject``: the
   stored suspended Job), timed as the ``update`` verb; a denied or failed UPDATE leaves
   the Job suspended, gives its quota back and is an error of the run.
3. *Job controller*: creates the pods of the unsuspended Job in the ``MiniApiServer``
   the extender watches.
4. *kube-scheduler*: one pod at a time: in-tree fit over its own node cache, ``/filter``
   with the candidate names (``nodeCacheCapable: true``), ``/prioritize`` when more
   than one node is left, weighted score combination, then ``/bind``, which runs while
   the next pod is already being filtered (as kube-scheduler's binding cycle does). An
   unschedulable pod is retried after a pod ends (a cluster event) and a 1 s backoff.
5. *kubelet*: a bound pod runs for its (compressed) duration, then is deleted; the
   extender's watch frees its GPUs, and when all of a job's pods ended Kueue releases
   the job's quota.

Against a remote deployment (``remote_pods``), steps 3 and 5 write to the deployment's
kube-apiserver instead: each pod is created there (in the load test's own namespace,
with the uid the API gives it) before it is scheduled, and deleted there when it ends,
so the remote extender's watch frees its GPUs as in a cluster.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from typing import Any

import aiohttp

from cluster import jsonio, labels
from cluster.clock import Clock
from loadtest.inputs.fleet import RACK_LABEL, JobSpec
from loadtest.sim import kueue, objects, scheduling
from loadtest.sim.apiserver import PODS, MiniApiServer
from loadtest.sim.records import Denial, JobRun, PodRun, Sample, SimResult
from loadtest.sim.remote_pods import RemoteClusterError, RemotePods
from loadtest.sim.targets import Targets

RETRY_BACKOFF_S = 1.0
RETRY_ANYWAY_S = 5.0
SAMPLE_EVERY_S = 0.25


class ClusterSim:
    def __init__(
        self,
        targets: Targets,
        api: MiniApiServer,
        nodes: list[dict[str, Any]],
        policy: list[dict[str, Any]],
        jobs: list[JobSpec],
        *,
        clock: Clock,
        extender_weight: int = 5,
        drain_s: float = 60.0,
        seed: int = 1,
        progress: Any = None,
        remote_pods: RemotePods | None = None,
    ) -> None:
        self.targets, self.api, self.clock = targets, api, clock
        self.remote_pods = remote_pods
        self.jobs_in = jobs
        self.weight = extender_weight
        self.drain_s = drain_s
        self.progress = progress
        self.rng = random.Random(seed)
        self.setup = kueue.setup_from_objects(policy)
        self.book = kueue.QuotaBook(self.setup)
        self.rooms = {n["metadata"]["name"]: scheduling.node_room(n) for n in nodes}
        self.room_order = list(self.rooms.values())
        self.nodes_to_find = scheduling.nodes_to_find(len(self.room_order))
        self.next_start = 0
        self.unhealthy = {
            n["metadata"]["name"]: {
                int(i)
                for i in n["metadata"]
                .get("annotations", {})
                .get(labels.UNHEALTHY_GPUS, "")
                .split(",")
                if i.strip()
            }
            for n in nodes
        }
        self.result = SimResult(
            gpus_total=sum(r.gpus for r in self.rooms.values()), nodes=len(nodes)
        )
        self.pending: dict[str, kueue.Workload] = {}
        self.active: deque[str] = deque()
        self.unschedulable: dict[str, float] = {}
        self.gpu_milli: dict[tuple[str, int], int] = {}
        self.wake_scheduler = asyncio.Event()
        self.wake_kueue = asyncio.Event()
        self.last_event_s = 0.0
        self.reviews = self.updates = self.binds = 0
        self.start = 0.0
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: list[asyncio.TimerHandle] = []

    # ------------------------------------------------------------ helpers

    def now_s(self) -> float:
        return self.clock.monotonic() - self.start

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, target: str, path: str, body: Any) -> tuple[int, bytes, float]:
        t = self.targets.webhook if target == "webhook" else self.targets.extender
        began = self.clock.monotonic()
        async with t.session.post(
            t.url + path, data=jsonio.dumps(body), headers={"Content-Type": "application/json"}
        ) as response:
            payload = await response.read()
        return response.status, payload, self.clock.monotonic() - began

    # ------------------------------------------------------------ kube-apiserver + webhook

    async def _create_job(self, spec: JobSpec, intended: float) -> None:
        job = JobRun(spec, created_s=intended - self.start)
        self.result.jobs[spec.name] = job
        uid = f"review-{spec.namespace}-{spec.name}"
        review = objects.admission_review(spec.job, uid)
        try:
            status, body, _ = await self._post("webhook", "/mutate?timeout=10s", review)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.result.errors[f"mutate:{type(exc).__name__}"] += 1
            return
        self.result.latencies["mutate"].append(self.clock.monotonic() - intended)
        self.reviews += 1
        if status != 200:
            self.result.errors[f"mutate:http-{status}"] += 1
            return
        try:
            verdict = objects.read_verdict(spec.job, uid, body)
        except objects.BadAnswer as exc:
            self.result.errors[f"mutate:bad-answer: {exc}"] += 1
            return
        if not verdict.allowed:
            self.result.denials.append(Denial(spec.name, spec.kind, verdict.code, verdict.message))
            if not spec.kind.startswith("bad-"):
                self.result.unexpected_denials += 1
            return
        stored = verdict.patched
        job.stored = stored
        job.local_queue = f"{spec.namespace}/{stored['metadata']['labels'][labels.QUEUE_NAME]}"
        lq = stored["metadata"]["labels"][labels.QUEUE_NAME]
        cq = self.setup.local_queues.get((spec.namespace, lq))
        if cq is None or not stored["spec"].get("suspend"):
            self.result.errors["mutate:not-suspended-or-unknown-queue"] += 1
            return
        job.cluster_queue = cq
        job.demand = objects.job_demand(stored)
        terms = objects.affinity_terms(stored["spec"]["template"]["spec"])
        allowed = frozenset(
            name
            for name in self.setup.cluster_queues[cq].flavors
            if name in self.setup.flavors
            and objects.matches_terms(self.setup.flavors[name].node_labels, terms)
        )
        self._seq += 1
        self.pending[spec.name] = kueue.Workload(
            spec.name, cq, job.demand.resource, job.demand.total, allowed, self._seq
        )
        self.wake_kueue.set()

    async def _arrivals(self) -> None:
        for spec in self.jobs_in:
            due = self.start + spec.at_s
            delay = due - self.clock.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._spawn(self._create_job(spec, due))

    # ------------------------------------------------------------ Kueue + job controller

    async def _kueue(self) -> None:
        while True:
            await self.wake_kueue.wait()
            self.wake_kueue.clear()
            for admission in kueue.admit_pending(self.book, list(self.pending.values())):
                self._start_job(admission)

    def _start_job(self, admission: kueue.Admission) -> None:
        name = admission.workload.key
        del self.pending[name]
        job = self.result.jobs[name]
        job.flavor, job.borrowed = admission.flavor, admission.borrowed
        self._spawn(self._unsuspend(job, self.clock.monotonic()))

    async def _unsuspend(self, job: JobRun, intended: float) -> None:
        """Kueue's write, reviewed by the webhook as an UPDATE; then the pods. The job
        counts as admitted (at the time Kueue decided) once the write is allowed."""
        admitted_s = intended - self.start
        assert job.stored is not None
        flavor = self.setup.flavors[job.flavor]
        running = objects.unsuspend(job.stored, flavor.node_labels)
        uid = f"review-update-{job.spec.namespace}-{job.spec.name}"
        review = objects.admission_review(running, uid, operation="UPDATE", old=job.stored)
        failure = ""
        try:
            status, body, _ = await self._post("webhook", "/mutate?timeout=10s", review)
            self.result.latencies["update"].append(self.clock.monotonic() - intended)
            self.updates += 1
            if status != 200:
                failure = f"http-{status}"
            else:
                verdict = objects.read_verdict(running, uid, body)
                if verdict.allowed:
                    running = verdict.patched
                else:
                    failure = f"denied {verdict.code}: {verdict.message[:120]}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            failure = type(exc).__name__
        except objects.BadAnswer as exc:
            failure = f"bad-answer: {exc}"
        if failure:
            # kube-apiserver refused Kueue's write: the Job stays suspended and Kueue
            # gives the quota back (a denied unsuspend is a webhook bug the run reports).
            self.result.errors[f"update:{failure}"] += 1
            self._release(job)
            return
        job.stored, job.admitted_s = running, admitted_s
        await self._create_pods(job, running)

    async def _create_pods(self, job: JobRun, running: dict[str, Any]) -> None:
        assert job.demand is not None
        name = job.spec.name
        for pod in objects.job_pods(running, "loadtest"):
            if self.remote_pods is not None:
                try:
                    pod = await self.remote_pods.create(  # noqa: PLW2901
                        self.remote_pods.pod_for(pod)
                    )
                except RemoteClusterError as exc:
                    # The pod does not exist: the run's checks count it as lost.
                    self.result.errors[f"pod-create:{str(exc)[:100]}"] += 1
                    continue
            else:
                self.api.put(PODS, pod)
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            whole = job.demand.resource == labels.GPU_RESOURCE
            self.result.pods[key] = PodRun(
                key,
                name,
                pod,
                objects.pod_needs(pod),
                job.demand.per_pod if whole else 0,
                0 if whole else job.demand.per_pod,
                job.spec.run_s,
                self.now_s(),
            )
            job.pods.append(key)
            self.active.append(key)
            self.wake_scheduler.set()
        self.wake_scheduler.set()

    def _release(self, job: JobRun) -> None:
        assert job.demand is not None
        self.book.release(job.cluster_queue, job.flavor, job.demand.resource, job.demand.total)
        self.wake_kueue.set()

    # ------------------------------------------------------------ kube-scheduler

    async def _scheduler(self) -> None:
        while True:
            if not self.active:
                self.wake_scheduler.clear()
                await self.wake_scheduler.wait()
                continue
            key = self.active.popleft()
            pod = self.result.pods[key]
            if pod.ended or pod.bound_s is not None:
                continue
            await self._schedule_one(pod)

    def _unschedulable(self, pod: PodRun, reason: str) -> None:
        self.unschedulable[pod.key] = self.now_s()
        self.result.filter_reasons[reason] += 1

    async def _schedule_one(self, pod: PodRun) -> None:
        pod.attempts += 1
        pod.last_attempt_s = self.now_s()
        began = self.clock.monotonic()
        names, looked = scheduling.feasible_nodes(
            self.room_order, pod.needs, self.next_start, self.nodes_to_find
        )
        self.next_start = (self.next_start + looked) % len(self.room_order)
        if not names:
            self._unschedulable(pod, "in-tree: no node has the CPU/memory/GPU count or labels")
            return
        args = {"Pod": pod.obj, "Nodes": None, "NodeNames": names}
        try:
            status, body, took = await self._post("extender", "/filter", args)
            self.result.latencies["filter"].append(took)
            answer = jsonio.loads(body) if status == 200 else {}
            if status != 200 or answer.get("Error"):
                self.result.errors[f"filter:{status} {answer.get('Error', '')[:80]}"] += 1
                self._unschedulable(pod, "filter error")
                return
            passed = list(answer.get("NodeNames") or [])
            if not passed:
                failed = {
                    **(answer.get("FailedNodes") or {}),
                    **(answer.get("FailedAndUnresolvableNodes") or {}),
                }
                reason = next(iter(failed.values()), "no node passed")
                self._unschedulable(pod, _reason_class(str(reason)))
                return
            scores: dict[str, int] = {}
            if len(passed) > 1:
                args = {"Pod": pod.obj, "Nodes": None, "NodeNames": passed}
                status, body, took = await self._post("extender", "/prioritize", args)
                self.result.latencies["prioritize"].append(took)
                if status != 200:
                    self.result.errors[f"prioritize:{status}"] += 1
                    self._unschedulable(pod, "prioritize error")
                    return
                scores = {e["Host"]: int(e["Score"]) for e in jsonio.loads(body) or []}
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            self.result.errors[f"filter/prioritize:{type(exc).__name__}"] += 1
            self._unschedulable(pod, "extender unreachable")
            return
        in_tree = {n: scheduling.least_allocated(self.rooms[n], pod.needs) for n in passed}
        totals = scheduling.combine_scores(passed, in_tree, scores, self.weight)
        host = scheduling.select_host(totals, self.rng.randrange)
        assert host is not None
        self.rooms[host].add(pod.key, pod.needs)  # kube-scheduler assumes before binding
        pod.node = host
        self._spawn(self._bind(pod, host, began))

    async def _bind(self, pod: PodRun, host: str, began: float) -> None:
        meta = pod.obj["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": host,
        }
        error = refusal = ""
        try:
            status, body, took = await self._post("extender", "/bind", args)
            self.result.latencies["bind"].append(took)
            if status != 200:
                error = f"http {status}"
            else:
                refusal = str(jsonio.loads(body).get("Error") or "")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            error = type(exc).__name__
        if error or refusal:
            if error:
                self.result.errors[f"bind:{error[:80]}"] += 1
            else:
                # The extender re-checks at bind against every assumption made since
                # this pod's filter (the next pods were filtered meanwhile): a refusal
                # is the design working, and the pod is retried.
                self.result.bind_refusals[_reason_class(refusal)] += 1
            self.rooms[host].remove(pod.key, pod.needs)
            pod.node = ""
            self._unschedulable(pod, "bind refused")
            return
        self.result.latencies["schedule"].append(self.clock.monotonic() - began)
        self.binds += 1
        pod.bound_s = self.now_s()
        pod.rack = self.rooms[host].labels.get(RACK_LABEL, "")
        stored = self.api.store[PODS].get(pod.key, {})
        pod.indices = str(
            stored.get("metadata", {}).get("annotations", {}).get(labels.GPU_INDICES, "")
        )
        self._account(pod, +1)
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(pod.run_s, self._end_pod, pod))

    def _account(self, pod: PodRun, sign: int) -> None:
        """The GPUs the extender gave, checked: never over 1000 milli, never unhealthy.

        Only a local extender writes its ``gpu-indices`` annotation into this run's API
        server; a remote one writes to its own cluster, so there is nothing to check."""
        if not self.targets.local:
            return
        if not pod.indices:
            if pod.gpus or pod.milli:
                self.result.over_allocations.append(f"{pod.key}: bound without gpu-indices")
            return
        per_gpu = 1000 if pod.gpus else pod.milli
        indices = [int(i) for i in pod.indices.split(",") if i.strip()]
        if sign > 0 and pod.gpus and len(indices) != pod.gpus:
            self.result.over_allocations.append(f"{pod.key}: {len(indices)} GPUs for {pod.gpus}")
        for index in indices:
            slot = (pod.node, index)
            self.gpu_milli[slot] = self.gpu_milli.get(slot, 0) + sign * per_gpu
            if sign > 0 and self.gpu_milli[slot] > 1000:
                self.result.over_allocations.append(
                    f"{pod.node} GPU {index}: {self.gpu_milli[slot]} milli"
                )
            if sign > 0 and index in self.unhealthy.get(pod.node, ()):
                self.result.unhealthy_used.append(f"{pod.key} on {pod.node} GPU {index}")

    # ------------------------------------------------------------ kubelet

    def _end_pod(self, pod: PodRun) -> None:
        pod.ended = True
        if self.remote_pods is not None:
            self._spawn(self._delete_remote(pod))
        else:
            self.api.delete(PODS, pod.key)
        self.rooms[pod.node].remove(pod.key, pod.needs)
        self._account(pod, -1)
        self.last_event_s = self.now_s()
        job = self.result.jobs[pod.job]
        job.ended_pods += 1
        if job.ended_pods == len(job.pods):
            job.finished_s = self.now_s()
            self._release(job)

    async def _delete_remote(self, pod: PodRun) -> None:
        assert self.remote_pods is not None
        try:
            await self.remote_pods.delete(pod.obj["metadata"]["name"])
        except RemoteClusterError as exc:
            # Its GPUs stay taken in the deployment until the cleanup at exit.
            self.result.errors[f"pod-delete:{str(exc)[:100]}"] += 1

    async def _retry(self) -> None:
        """Unschedulable pods back to the active queue after a cluster event and the
        backoff, or after a while anyway (kube-scheduler's flush)."""
        while True:
            await asyncio.sleep(0.1)
            now = self.now_s()
            ready = [
                key
                for key, tried in self.unschedulable.items()
                if now - tried >= RETRY_ANYWAY_S
                or (self.last_event_s > tried and now - tried >= RETRY_BACKOFF_S)
            ]
            for key in ready:
                del self.unschedulable[key]
                self.active.append(key)
            if ready:
                self.wake_scheduler.set()

    # ------------------------------------------------------------ sampling

    def _sample(self) -> None:
        pods = self.result.pods.values()
        allocated = sum(
            p.gpus + p.milli / 1000 for p in pods if p.bound_s is not None and not p.ended
        )
        running = sum(1 for p in pods if p.bound_s is not None and not p.ended)
        pending = sum(1 for p in pods if p.bound_s is None and not p.ended)
        waiting: Counter[str] = Counter()
        for name in self.pending:
            waiting[self.result.jobs[name].local_queue] += 1
        self.result.samples.append(
            Sample(
                self.now_s(), allocated, running, pending, dict(waiting), self.reviews, self.binds
            )
        )
        for target in (self.targets.webhook, self.targets.extender):
            target.note_rss(self.now_s())
        if self.progress is not None:
            self.progress(self)

    async def _sampler(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def busy(self) -> bool:
        live = any(not p.ended for p in self.result.pods.values())
        return bool(self.pending) or live or bool(self._tasks)

    # ------------------------------------------------------------ the run

    async def run(self) -> SimResult:
        self.start = self.clock.monotonic()
        background = [
            asyncio.create_task(work)
            for work in (self._kueue(), self._scheduler(), self._retry(), self._sampler())
        ]
        try:
            await self._arrivals()
            self.result.arrivals_s = self.now_s()
            stop_at = self.now_s() + self.drain_s
            # Polled: "busy" spans queues, timers and tasks with no one event to wait on.
            while True:
                if not self.busy() or self.now_s() >= stop_at:
                    break
                await asyncio.sleep(0.1)
            self._sample()
        finally:
            for task in background:
                task.cancel()
            for timer in self._timers:
                timer.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.result.duration_s = self.now_s()
        self.result.gpus_checked = self.targets.local
        self.result.rss = {
            t.name: list(t.rss_samples) for t in (self.targets.webhook, self.targets.extender)
        }
        return self.result


def _reason_class(reason: str) -> str:
    """A filter reason without its numbers, to count alike reasons together."""
    words = [w for w in reason.replace(",", " ").split() if not any(c.isdigit() for c in w)]
    return " ".join(words[:8]) or "no node passed"
