"""One ``sched-perf`` run: a fresh control plane, the nodes, one kube-scheduler profile,
the pods; what the watch and ``/proc`` saw.

Layer: I/O (starts processes, talks to kube-apiserver over loopback, reads ``/proc``,
spawns threads). Must not decide where anything goes (kube-scheduler and the extender
do) and must not leave a process running when ``run_profile`` returns or raises.

Each run starts from nothing: etcd with a fresh data folder, kube-apiserver, a
kube-controller-manager that only makes ServiceAccounts, then the nodes (created,
made Ready and untainted through the API, several at a time over keep-alive
connections), then the background pods if any (bound at creation), then (``tessera``)
the extender as the shipped Deployment runs it, then
kube-scheduler with the profile's configuration. Only then the clock starts: a watch on
the pods, a sampler of the processes' CPU, and the pods created over a few keep-alive
connections, all at once or at a fixed rate. The run ends when every pod is bound, or
when no pod has been bound for ``idle_s`` (the rest are unschedulable). Then
(``tessera``) the extender is killed and started again, and timed to ready: what a
crash costs, its cache rebuilt from a list of every node and pod.
"""

from __future__ import annotations

import contextlib
import http.client
import queue
import shutil
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from cluster import jsonio
from cluster.clock import Clock
from loadtest.measure.pinned import proc_cpu_s
from loadtest.measure.stats import scrape_counters
from loadtest.ports import free_port
from loadtest.schedperf import profiles
from loadtest.schedperf.results import RunRecord, placement
from loadtest.schedperf.workload import (
    BACKGROUND_NAMESPACE,
    NAMESPACE,
    PodShape,
    background_pods,
    pod_manifest,
)
from loadtest.stack.controlplane import ControlPlane, Credentials
from loadtest.stack.fleet import FakeNode
from loadtest.stack.kubeapi import KubeApi
from loadtest.stack.servers import Probe, ServerProcess

CONTROLLERS: Final = "serviceaccount"
"""Only what pods need to be created (a namespace's ``default`` ServiceAccount): the
other controllers would watch the pods too and add noise to the apiserver's CPU."""
CLIENTS: Final = 4
"""Keep-alive connections creating nodes and pods: enough to create 2,000 pods within
seconds, few enough to leave the 2 cores to the control plane."""
SAMPLE_S: Final = 0.2
_PATHS: Final = {"pods": f"/api/v1/namespaces/{NAMESPACE}/pods"}

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Setup:
    """Everything a run needs besides the profile: the same for every run."""

    binaries: Path
    shipped: Mapping[str, Any]
    nodes: Sequence[FakeNode]
    shapes: Sequence[PodShape]
    rate: float
    idle_s: float
    timeout_s: float
    workdir: Path
    clock: Clock
    say: Say = print
    nodes_to_score: int | None = None
    """The tessera profile's ``percentageOfNodesToScore``; None: as shipped, 0: adaptive."""
    extender_env: Mapping[str, str] = field(default_factory=dict)
    """The extender's environment: its shipped Deployment's settings, and any override."""
    background: int = 0
    """Pods bound before the measured ones (``workload.background_pods``)."""


class _Client:
    """One keep-alive HTTPS connection to kube-apiserver (not shared between threads)."""

    def __init__(self, credentials: Credentials) -> None:
        url = urllib.parse.urlsplit(credentials.server)
        self._host, self._port = url.hostname or "127.0.0.1", url.port
        self._context = ssl.create_default_context(cafile=str(credentials.ca_file))
        self._headers = {
            "Authorization": f"Bearer {credentials.token}",
            "Accept": "application/json",
        }
        self._conn: http.client.HTTPSConnection | None = None

    def send(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=60, context=self._context
                )
            try:
                headers = {**self._headers, "Content-Type": content_type}
                self._conn.request(method, path, body=jsonio.dumps(body), headers=headers)
                response = self._conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _ok(status: int, payload: bytes, what: str, *, exists_ok: bool = False) -> None:
    if 200 <= status < 300 or (exists_ok and status == http.HTTPStatus.CONFLICT):
        return
    raise RuntimeError(f"{what}: HTTP {status}: {payload[:300].decode(errors='replace')}")


def _in_parallel(credentials: Credentials, jobs: Sequence[Any], work: Callable[..., None]) -> None:
    """``work(client, job)`` for every job, on ``CLIENTS`` threads with a connection each;
    the first error is raised once all threads have stopped."""
    todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for job in jobs:
        todo.put(job)
    errors: list[BaseException] = []

    def worker() -> None:
        client = _Client(credentials)
        try:
            while not errors:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                work(client, job)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def create_nodes(credentials: Credentials, nodes: Sequence[FakeNode], now: Any) -> None:
    """Create each node, set its status (Ready, GPUs allocatable) and drop the not-ready
    taint admission gave it (there is no kubelet and no node-lifecycle controller)."""

    def one(client: _Client, node: FakeNode) -> None:
        path = f"/api/v1/nodes/{node.name}"
        _ok(*client.send("POST", "/api/v1/nodes", node.manifest(now), "application/json"),
            f"create node {node.name}")  # fmt: skip
        merge = "application/merge-patch+json"
        _ok(*client.send("PATCH", f"{path}/status", node.status(now), merge), "node status")
        _ok(*client.send("PATCH", path, {"spec": {"taints": None}}, merge), "node taints")

    _in_parallel(credentials, nodes, one)


class _Watch:
    """Records the first moment each pod of the namespace is seen bound, from a list and
    then one watch; ``stop`` closes the watch's connection, so kube-apiserver can shut
    down at once instead of waiting for the request to end."""

    def __init__(self, credentials: Credentials, clock: Clock, start: float) -> None:
        self.bound: dict[str, float] = {}
        self.last_bind = 0.0
        self.error: BaseException | None = None
        self._credentials, self._clock, self._start = credentials, clock, start
        self._stopping = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _see(self, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName") and name not in self.bound:
            now = self._clock.monotonic() - self._start
            self.bound[name] = now
            self.last_bind = now

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._list_and_watch()
        except BaseException as exc:
            if not self._stopping.is_set():
                self.error = exc

    def _list_and_watch(self) -> None:
        api = KubeApi(self._credentials, self._clock)
        listed = api.get(_PATHS["pods"])
        for pod in listed["items"]:
            self._see(pod)
        version = listed["metadata"]["resourceVersion"]
        url = urllib.parse.urlsplit(self._credentials.server)
        context = ssl.create_default_context(cafile=str(self._credentials.ca_file))
        self._conn = http.client.HTTPSConnection(
            url.hostname or "127.0.0.1", url.port, timeout=None, context=context
        )
        params = urllib.parse.urlencode(
            {"watch": "1", "resourceVersion": version, "timeoutSeconds": "3600"}
        )
        self._conn.request(
            "GET",
            f"{_PATHS['pods']}?{params}",
            headers={"Authorization": f"Bearer {self._credentials.token}"},
        )
        response = self._conn.getresponse()
        if response.status != http.HTTPStatus.OK:
            raise RuntimeError(f"watch of pods: HTTP {response.status}")
        for line in response:
            event = jsonio.loads(line)
            if event.get("type") == "ERROR":
                return  # expired: list again
            self._see(event.get("object") or {})

    def stop(self) -> None:
        self._stopping.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


class _CpuSampler:
    """CPU seconds of each component every ``SAMPLE_S``, from ``/proc``."""

    def __init__(self, pids: Mapping[str, int], clock: Clock, start: float) -> None:
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._pids, self._clock, self._start = pids, clock, start
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> tuple[float, dict[str, float]]:
        values = {}
        for name, pid in self._pids.items():
            with contextlib.suppress(OSError):
                values[name] = proc_cpu_s(pid)
        return self._clock.monotonic() - self._start, values

    def start(self) -> None:
        self.samples.append(self.read())
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(SAMPLE_S):
            self.samples.append(self.read())

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.samples.append(self.read())

    def used_until(self, moment: float) -> dict[str, float]:
        """CPU seconds from the first sample to the first one at or after ``moment``."""
        first = self.samples[0][1]
        last = next((v for t, v in self.samples if t >= moment), self.samples[-1][1])
        return {name: round(last[name] - first[name], 3) for name in first if name in last}


def _create_pods(
    credentials: Credentials, setup: Setup, scheduler: str, start: float
) -> dict[str, float]:
    """POST every pod (at ``setup.rate`` a second, or all at once); the moment each POST
    was sent, in seconds since ``start``."""
    created: dict[str, float] = {}
    clock = setup.clock
    path = _PATHS["pods"]
    jobs = list(enumerate(setup.shapes))

    def one(client: _Client, job: tuple[int, PodShape]) -> None:
        index, shape = job
        if setup.rate > 0:
            due = start + index / setup.rate
            delay = due - clock.monotonic()
            if delay > 0:
                time.sleep(delay)
        body = pod_manifest(shape, scheduler)
        created[shape.name] = clock.monotonic() - start
        _ok(*client.send("POST", path, body, "application/json"), f"create pod {shape.name}")

    _in_parallel(credentials, jobs, one)
    return created


def _namespace(api: KubeApi, name: str = NAMESPACE) -> None:
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": name}})  # fmt: skip

    def ready() -> bool | None:
        found = api.items(f"/api/v1/namespaces/{name}/serviceaccounts")
        return True if any(a["metadata"]["name"] == "default" for a in found) else None

    # the ServiceAccount admission plugin refuses pods until their namespace's default exists
    api.wait(f"ServiceAccount default in namespace {name}", ready, timeout=60)


def create_background(credentials: Credentials, pods: Sequence[Mapping[str, Any]]) -> None:
    """POST the background pods, already bound, several at a time."""
    path = f"/api/v1/namespaces/{BACKGROUND_NAMESPACE}/pods"

    def one(client: _Client, pod: Mapping[str, Any]) -> None:
        _ok(*client.send("POST", path, pod, "application/json"),
            f"create background pod {pod['metadata']['name']}")  # fmt: skip

    _in_parallel(credentials, pods, one)


def _start_extender(
    plane: ControlPlane, workdir: Path, clock: Clock, env: Mapping[str, str]
) -> ServerProcess:
    """``python -m extender`` with the settings of the shipped Deployment (``env``: its
    JSON logs, its block/rack/hostname levels, what it chooses in ``/filter``), reading
    the cluster as admin."""
    port = free_port()
    extender = ServerProcess(
        "extender",
        ["--host", "127.0.0.1", "--port", str(port),
         "--kubeconfig", str(plane.credentials.kubeconfig)],
        workdir / "logs" / "extender.log",
        Probe(port, "/readyz"),
        clock,
        env=env,
    )  # fmt: skip
    extender.start(timeout=120)
    return extender


def _wait_done(watch: _Watch, setup: Setup, created_all: threading.Event, start: float) -> None:
    """Until every pod is bound, no pod was bound for ``idle_s`` (after the last was
    created), or ``timeout_s`` passed."""
    total = len(setup.shapes)
    clock = setup.clock
    while True:
        time.sleep(SAMPLE_S)
        if watch.error is not None:
            raise watch.error
        if len(watch.bound) >= total:
            return
        elapsed = clock.monotonic() - start
        if elapsed > setup.timeout_s:
            return
        if created_all.is_set() and elapsed - watch.last_bind > setup.idle_s:
            return


@dataclass(slots=True)
class _Running:
    plane: ControlPlane
    extender: ServerProcess | None = None
    stoppers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            with contextlib.suppress(Exception):
                stop()
        self.plane.stop_component("kube-scheduler")
        if self.extender is not None:
            self.extender.stop()
        self.plane.stop()


def run_profile(profile: str, repeat: int, setup: Setup) -> RunRecord:
    """One profile's run on a cluster of its own; stops everything before returning."""
    clock, say = setup.clock, setup.say
    workdir = setup.workdir / f"r{repeat}-{profile}"
    plane = ControlPlane(setup.binaries, workdir / "cp", controllers=CONTROLLERS, clock=clock)
    running = _Running(plane)
    try:
        plane.start()
        api = KubeApi(plane.credentials, clock)
        _namespace(api)
        begun = clock.monotonic()
        create_nodes(plane.credentials, setup.nodes, clock.now())
        say(f"  {len(setup.nodes)} nodes in {clock.monotonic() - begun:.1f} s")
        if setup.background:
            _namespace(api, BACKGROUND_NAMESPACE)
            begun = clock.monotonic()
            create_background(plane.credentials, background_pods(setup.nodes, setup.background))
            say(f"  {setup.background} background pods in {clock.monotonic() - begun:.1f} s")
        url = ""
        ready_s = 0.0
        if profile == profiles.TESSERA:
            begun = clock.monotonic()
            running.extender = _start_extender(plane, workdir, clock, setup.extender_env)
            ready_s = clock.monotonic() - begun
            url = f"http://127.0.0.1:{running.extender.probe.port}"
        config = profiles.scheduler_config(
            profile, setup.shipped, url, nodes_to_score=setup.nodes_to_score
        )
        config_path = workdir / "kube-scheduler-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        plane.start_scheduler(config_path)
        record = _measure(profile, repeat, setup, plane, api, running)
        if running.extender is None:
            return record
        restart_s = _restart(running.extender, clock)
        say(f"  extender ready {ready_s:.1f} s after its start, {restart_s:.1f} s after a restart")
        return replace(record, extender_ready_s={"start": ready_s, "restart": restart_s})
    finally:
        running.stop()
        shutil.rmtree(workdir / "cp" / "etcd", ignore_errors=True)


def _restart(extender: ServerProcess, clock: Clock) -> float:
    """Kill the extender and start it again, as a crash and its Deployment's restart:
    seconds until it is ready, its cache rebuilt from a list of every node and pod."""
    extender.kill()
    begun = clock.monotonic()
    extender.start(timeout=300)
    return clock.monotonic() - begun


def _measure(  # noqa: PLR0917 - the run's state, passed on
    profile: str,
    repeat: int,
    setup: Setup,
    plane: ControlPlane,
    api: KubeApi,
    running: _Running,
) -> RunRecord:
    clock = setup.clock
    pids = {
        "scheduler": plane.pid("kube-scheduler"),
        "extender": running.extender.pid if running.extender is not None else None,
        "apiserver": plane.pid("kube-apiserver"),
        "etcd": plane.pid("etcd"),
    }
    counted = _counts(plane)
    start = clock.monotonic()
    watch = _Watch(plane.credentials, clock, start)
    sampler = _CpuSampler({k: v for k, v in pids.items() if v is not None}, clock, start)
    watch.start()
    running.stoppers.append(watch.stop)
    sampler.start()
    running.stoppers.append(sampler.stop)
    created_all = threading.Event()
    scheduler = profiles.scheduler_name(setup.shipped)
    creating: dict[str, float] = {}
    failure: list[BaseException] = []

    def create() -> None:
        try:
            creating.update(_create_pods(plane.credentials, setup, scheduler, start))
        except BaseException as exc:
            failure.append(exc)
        finally:
            created_all.set()

    creator = threading.Thread(target=create, daemon=True)
    creator.start()
    _wait_done(watch, setup, created_all, start)
    creator.join()
    if failure:
        raise failure[0]
    sampler.stop()
    watch.stop()
    bound = dict(watch.bound)
    cpu = sampler.used_until(max(bound.values(), default=0.0))
    pods = api.items(_PATHS["pods"])
    requests, attempts = _counts(plane, since=counted)
    return RunRecord(
        profile=profile,
        repeat=repeat,
        created=creating,
        bound=bound,
        cpu_s=cpu,
        placement=placement(setup.shapes, pods, setup.nodes),
        requests=requests,
        attempts=attempts,
    )


_Counts = tuple[dict[str, float], dict[str, float]]


def _counts(plane: ControlPlane, since: _Counts | None = None) -> _Counts:
    """kube-apiserver's requests by verb and resource (``POST pods/binding``) and
    kube-scheduler's scheduling attempts by result, counted so far or after ``since``:
    what each pod cost the control plane besides CPU."""
    served = scrape_counters(
        plane.metrics("kube-apiserver"), "apiserver_request_total",
        ("verb", "resource", "subresource"),
    )  # fmt: skip
    requests = {
        f"{verb} {resource}/{sub}" if sub else f"{verb} {resource}": n
        for (verb, resource, sub), n in served.items()
    }
    page = plane.metrics("kube-scheduler")
    tried = scrape_counters(page, "scheduler_schedule_attempts_total", ("result",))
    # kube-scheduler's opportunistic batching (beta, on by default since v1.35) lets a pod
    # shaped like the one before it take the next node of that pod's ranking without
    # filtering or scoring: only for profiles without extenders, so it counts apart
    hinted = scrape_counters(page, "scheduler_batch_attempts_total", ("result",))
    attempts = {result: n for (result,), n in tried.items()} | {
        f"batch {result}": n for (result,), n in hinted.items()
    }
    if since is None:
        return requests, attempts
    return _grown(requests, since[0]), _grown(attempts, since[1])


def _grown(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What each counter gained since ``before``, those that gained anything."""
    return {k: n - before.get(k, 0.0) for k, n in now.items() if n > before.get(k, 0.0)}
