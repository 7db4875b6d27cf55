"""The extender as the fuzz properties drive it: served over plain HTTP (as the sidecar
listens on 127.0.0.1) from the golden cluster, with the golden cases' settings, and
what every answer of each verb must be.

Layer: I/O (test support: serves the extender on loopback). The checks read answers
with the upstream wire shapes (``extender.wire``'s kube-scheduler side); a 4xx must say
why, briefly.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from aiohttp import web
from hypothesis import strategies as st

from cluster import jsonio
from cluster.clock import ManualClock
from cluster.files import load_objects
from cluster.snapshot import Snapshot
from extender import wire
from extender.app import CACHE, create_app
from extender.settings import ExtenderSettings
from tests.builders import BLOCK_LABEL, RACK_LABEL
from tests.fuzz import strategies as hostile
from tests.fuzz.harness import Answer, Client, ServedApp

GOLDEN: Final = hostile.GOLDEN / "extender"
CLUSTER: Final = GOLDEN / "cluster.yaml"
NOW: Final = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
LEVELS: Final = (
    ("block", BLOCK_LABEL),
    ("rack", RACK_LABEL),
    ("hostname", "kubernetes.io/hostname"),
)
"""The golden cases' topology (``tests/golden/test_extender_golden.py``)."""
VERBS: Final = ("/filter", "/prioritize", "/preempt", "/bind")
ERROR_BODY_LIMIT: Final = 16 * 1024

OBJECTS: Final = load_objects(CLUSTER)
NODE_NAMES: Final = tuple(o["metadata"]["name"] for o in OBJECTS if o["kind"] == "Node")
PODS: Final = tuple(o for o in OBJECTS if o["kind"] == "Pod")


@dataclass(frozen=True, slots=True)
class Extender:
    served: ServedApp
    client: Client
    baseline_mib: float = 0.0
    """Resident memory once the server is serving (set by each module's fixture)."""

    def snapshot(self) -> Snapshot:
        return self.served.read(self.served.app[CACHE].snapshot)

    def golden_answers(self) -> list[str]:
        """The golden cases (all but binds, those that need binds under way, and those
        of another config than this server's) whose answer over the wire is not the
        golden one."""
        wrong = []
        for path in sorted(GOLDEN.glob("*.request.json")):
            case = path.name.removesuffix(".request.json")
            request = jsonio.loads(path.read_bytes())
            if request["path"] == "/bind" or "assume" in request or "config" in request:
                continue
            raw = request.get("rawBody")
            body = raw.encode() if raw is not None else jsonio.dumps(request["body"])
            expected = jsonio.loads((GOLDEN / f"{case}.response.json").read_bytes())
            answer = self.client.post(request["path"], body)
            if (answer.status, answer.json()) != (expected["status"], expected["body"]):
                wrong.append(case)
        return wrong


def _app() -> web.Application:
    settings = ExtenderSettings(
        cluster_file=CLUSTER,
        topology_levels=LEVELS,
        pod_mix="default",  # the golden answers are scored with the built-in pod mix
    )
    return create_app(settings, clock=ManualClock(NOW))


@contextlib.contextmanager
def serving() -> Iterator[Extender]:
    with ServedApp(_app) as served:
        client = Client("127.0.0.1", served.port, None)
        try:
            yield Extender(served, client)
        finally:
            client.close()


# ---------------------------------------------------------------- what answers are


def _field(request: object, name: str) -> object:
    """A field of a decoded request as Go reads it: keys in any case, the last wins."""
    found = None
    if isinstance(request, dict):
        for key, value in request.items():
            if isinstance(key, str) and key.lower() == name.lower():
                found = value
    return found


def _names(request: object) -> set[str] | None:
    names = _field(request, "NodeNames")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return set(names)
    return None


def check_answer(verb: str, body: bytes, answer: Answer) -> None:
    """A 4xx is ``{"Error": reason}``; a 200 is the verb's upstream answer, to a body
    that was a request, and says nothing of nodes the request did not name."""
    if answer.status != 200:
        assert len(answer.body) <= ERROR_BODY_LIMIT, f"{len(answer.body)} bytes of error"
        error = answer.json()
        assert isinstance(error, dict)
        assert isinstance(error["Error"], str)
        assert error["Error"]
        return
    request = jsonio.loads(body)  # a 200 to a body that is not JSON fails here
    assert isinstance(request, dict)
    names = _names(request)
    if verb == "/filter":
        raw = answer.json()
        result = wire.decode_filter_result(answer.body)
        assert isinstance(raw["FailedNodes"], dict)
        assert isinstance(raw["FailedAndUnresolvableNodes"], dict)
        assert isinstance(raw["Error"], str)
        if not result.error:
            assert result.node_names is not None or result.nodes is not None
        if names is not None and not result.error:
            assert result.node_names is not None, "asked by name, answered without NodeNames"
            assert set(result.node_names) <= names
            assert set(result.failed) | set(result.unresolvable) <= names
    elif verb == "/prioritize":
        scores = wire.decode_priorities(answer.body)
        assert all(0 <= score <= 10 for _, score in scores), scores
        if names is not None:
            assert {host for host, _ in scores} <= names
    elif verb == "/preempt":
        chosen = wire.decode_preemption_result(answer.body)
        proposed = set()
        for field in ("NodeNameToMetaVictims", "NodeNameToVictims"):
            value = _field(request, field)
            if isinstance(value, dict):
                proposed |= set(value)
        assert set(chosen) <= proposed
    else:
        assert isinstance(wire.decode_binding_result(answer.body), str)


def double_booked(snapshot: Snapshot) -> list[str]:
    """GPUs given out beyond their capacity, or that their node does not have."""
    use: dict[tuple[str, int], int] = defaultdict(int)
    for allocation in snapshot.allocations.values():
        for index in allocation.indices:
            use[(allocation.node, index)] += allocation.milli_per_gpu
    problems = [f"{node} GPU {i}: {milli}/1000" for (node, i), milli in use.items() if milli > 1000]
    for node, index in use:
        state = snapshot.nodes.get(node)  # type: ignore[call-overload]
        if state is not None and index >= state.gpu_count:
            problems.append(f"{node} has no GPU {index}")
    return problems


def fresh_version(draw: st.DrawFn, doc: Any) -> None:
    """A damaged pod is a new content of it: the API would give it a new
    resourceVersion, and the extender reads a pod it saw before by uid and version."""
    pod = _field(doc, "Pod")
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if isinstance(metadata, dict):
        metadata["resourceVersion"] = str(draw(st.integers(10**6, 10**12)))
