"""Binding through kube-apiserver: what the cluster shows after each kind of outcome.

Against the fake kube-apiserver on a real socket for what it can play (refusals,
conflicts), and against a scripted API for broken connections, which a server that
answers cannot produce: a bind either ends bound, or ends unbound with its annotation
taken back, or says it cannot tell.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cluster.convert import pod_from_json
from cluster.feed import PODS_PATH
from cluster.kube import KubeClient, KubeConfig, Params, TransportError
from cluster.labels import GPU_INDICES
from cluster.model import NodeName
from extender.binder import ApiBinder, BindError, Placement
from tests.builders import pod_json
from tests.fakeapi import FakeApiServer, Fault


def placement(
    obj: dict[str, Any], node: str = "gpu-a", indices: tuple[int, ...] = (0, 1)
) -> Placement:
    return Placement(pod_from_json(obj), NodeName(node), indices)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def binder(api: FakeApiServer) -> AsyncIterator[ApiBinder]:
    async with KubeClient(KubeConfig.explicit(api.url)) as client:
        yield ApiBinder(client, timeout_s=2.0)


def annotations_of(api: FakeApiServer, key: str = "team-nlp/train-0") -> dict[str, str]:
    found: dict[str, str] = api.objects(PODS_PATH)[key]["metadata"].get("annotations", {})
    return found


async def test_a_bind_annotates_then_binds(api: FakeApiServer, binder: ApiBinder) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    await binder.bind(placement(pod))
    stored = api.objects(PODS_PATH)["team-nlp/train-0"]
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert annotations_of(api)[GPU_INDICES] == "0,1"
    assert [r.kind for r in api.requests] == ["patch", "post"]


async def test_a_refused_binding_takes_the_annotation_back(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    api.faults.append(Fault("post", 500, "InternalError", "etcd is sad"))
    with pytest.raises(BindError, match="etcd is sad") as failure:
        await binder.bind(placement(pod))
    assert not failure.value.uncertain
    assert GPU_INDICES not in annotations_of(api)
    assert "nodeName" not in api.objects(PODS_PATH)["team-nlp/train-0"]["spec"]


async def test_a_refused_annotation_never_binds(api: FakeApiServer, binder: ApiBinder) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    api.faults.append(Fault("patch", 422, "Invalid", "uid: field is immutable"))
    with pytest.raises(BindError, match="cannot annotate"):
        await binder.bind(placement(pod))
    assert [r.kind for r in api.requests] == ["patch"]


async def test_a_conflict_because_an_earlier_attempt_landed_is_success(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    api.put(PODS_PATH, pod_json("train-0", gpus=2, node="gpu-a", gpu_indices="0,1"))
    pending = pod_json("train-0", gpus=2)  # what the extender saw before the first attempt
    await binder.bind(placement(pending))
    assert annotations_of(api)[GPU_INDICES] == "0,1"


async def test_a_conflict_with_a_pod_bound_elsewhere_is_an_error(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    api.put(PODS_PATH, pod_json("train-0", gpus=2, node="gpu-b"))
    with pytest.raises(BindError, match="bound to node gpu-b") as failure:
        await binder.bind(placement(pod_json("train-0", gpus=2)))
    assert not failure.value.uncertain


# ---------------------------------------------------------------- broken connections


@dataclass
class ScriptedApi:
    """The binder's API seam, answering from a script: the Binding POST fails with
    ``post_error`` (or hangs), and reading the pod back gives ``read``."""

    post_error: Exception | None
    read: dict[str, Any] | Exception
    hang: bool = False
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def get_json(self, path: str, params: Params | None = None) -> dict[str, Any]:
        self.calls.append(("get", None))
        if isinstance(self.read, Exception):
            raise self.read
        return self.read

    async def post_json(self, path: str, body: Any, params: Params | None = None) -> dict[str, Any]:
        self.calls.append(("post", body))
        if self.hang:
            await asyncio.sleep(10)
        if self.post_error is not None:
            raise self.post_error
        return {}

    async def patch_json(
        self, path: str, body: Any, patch_type: Any = "merge", params: Params | None = None
    ) -> dict[str, Any]:
        self.calls.append(("patch", body))
        return {}


BROKEN = TransportError("POST binding: ServerDisconnectedError")
POD = pod_json("train-0", gpus=2)


def read_back(node: str | None) -> dict[str, Any]:
    return pod_json("train-0", gpus=2, node=node, gpu_indices="0,1")


@pytest.mark.parametrize(
    ("api", "outcome", "taken_back"),
    [
        pytest.param(ScriptedApi(BROKEN, read_back("gpu-a")), "bound", False, id="landed"),
        pytest.param(ScriptedApi(BROKEN, read_back(None)), "failed", True, id="not-landed"),
        pytest.param(ScriptedApi(None, read_back(None), hang=True), "failed", True, id="timed-out"),
        pytest.param(
            ScriptedApi(BROKEN, TransportError("GET pod: refused")),
            "uncertain",
            False,
            id="cannot-tell",
        ),
    ],
)
async def test_a_broken_binding_is_settled_by_reading_the_pod(
    api: ScriptedApi, outcome: str, taken_back: bool
) -> None:
    binder = ApiBinder(api, timeout_s=0.05)
    try:
        await binder.bind(placement(POD))
        seen = "bound"
    except BindError as exc:
        seen = "uncertain" if exc.uncertain else "failed"
    assert seen == outcome
    patches = [body for kind, body in api.calls if kind == "patch"]
    assert (patches[-1]["metadata"]["annotations"][GPU_INDICES] is None) is taken_back
