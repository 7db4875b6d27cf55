"""Binding through kube-apiserver: what the cluster shows after each kind of outcome.

Against the fake kube-apiserver on a real socket for what it can play (refusals,
conflicts), and against a scripted API for broken connections, which a server that
answers cannot produce: a bind either ends bound with its GPUs recorded, or ends
unbound with nothing written on the pod, or says it cannot tell. One request binds and
records: the Binding carries ``tessera.dev/gpu-indices`` in its own annotations, which
kube-apiserver copies onto the pod as it binds it; the pod itself is never patched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cluster.convert.pods import pod_from_json
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


async def test_one_binding_binds_the_pod_and_records_its_gpus(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2, annotations={"team": "nlp"}))
    await binder.bind(placement(pod))
    stored = api.objects(PODS_PATH)["team-nlp/train-0"]
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert annotations_of(api)[GPU_INDICES] == "0,1"
    assert annotations_of(api)["team"] == "nlp", "the pod's own annotations stay"
    (request,) = api.requests
    assert (request.kind, request.path) == (
        "post",
        "/api/v1/namespaces/team-nlp/pods/train-0/binding",
    )
    assert request.json() == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "train-0",
            "namespace": "team-nlp",
            "uid": pod["metadata"]["uid"],
            "annotations": {GPU_INDICES: "0,1"},
        },
        "target": {"kind": "Node", "name": "gpu-a"},
    }


async def test_a_pod_without_gpus_is_bound_with_nothing_to_record(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", cpu="2"))
    await binder.bind(placement(pod, indices=()))
    assert api.objects(PODS_PATH)["team-nlp/train-0"]["spec"]["nodeName"] == "gpu-a"
    assert GPU_INDICES not in annotations_of(api)
    assert "annotations" not in api.requests_of("post")[0].json()["metadata"]


async def test_a_refused_binding_leaves_nothing_on_the_pod(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    api.faults.append(Fault("post", 500, "InternalError", "etcd is sad"))
    with pytest.raises(BindError, match="etcd is sad") as failure:
        await binder.bind(placement(pod))
    assert not failure.value.uncertain
    assert GPU_INDICES not in annotations_of(api)
    assert "nodeName" not in api.objects(PODS_PATH)["team-nlp/train-0"]["spec"]
    assert [r.kind for r in api.requests] == ["post"]


async def test_a_pod_deleted_and_created_again_is_not_bound_in_its_place(
    api: FakeApiServer, binder: ApiBinder
) -> None:
    seen = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    api.delete(PODS_PATH, "team-nlp/train-0")
    again = pod_json("train-0", gpus=2)
    again["metadata"]["uid"] = "another-uid"  # same name, another pod
    api.put(PODS_PATH, again)
    with pytest.raises(BindError, match="the pod is not bound"):
        await binder.bind(placement(seen))
    assert "nodeName" not in api.objects(PODS_PATH)["team-nlp/train-0"]["spec"]
    assert GPU_INDICES not in annotations_of(api)


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
    ``post_error`` (or hangs), and reading the pod back gives ``read``. It has no way
    to patch a pod: the binder needs none."""

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


BROKEN = TransportError("POST binding: ServerDisconnectedError")
POD = pod_json("train-0", gpus=2)


def read_back(node: str | None) -> dict[str, Any]:
    return pod_json("train-0", gpus=2, node=node, gpu_indices="0,1")


@pytest.mark.parametrize(
    ("api", "outcome"),
    [
        pytest.param(ScriptedApi(BROKEN, read_back("gpu-a")), "bound", id="landed"),
        pytest.param(ScriptedApi(BROKEN, read_back(None)), "failed", id="not-landed"),
        pytest.param(ScriptedApi(None, read_back(None), hang=True), "failed", id="timed-out"),
        pytest.param(
            ScriptedApi(BROKEN, TransportError("GET pod: refused")), "uncertain", id="cannot-tell"
        ),
    ],
)
async def test_a_broken_binding_is_settled_by_reading_the_pod(
    api: ScriptedApi, outcome: str
) -> None:
    binder = ApiBinder(api, timeout_s=0.05)
    try:
        await binder.bind(placement(POD))
        seen = "bound"
    except BindError as exc:
        seen = "uncertain" if exc.uncertain else "failed"
    assert seen == outcome
    # one Binding, then at most a read: nothing to take back, since nothing else was written
    assert [kind for kind, _ in api.calls] == ["post", "get"]
    assert api.calls[0][1]["metadata"]["annotations"] == {GPU_INDICES: "0,1"}
