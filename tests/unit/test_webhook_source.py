"""The policy store between Kueue's watches and the reviews: Kueue rewrites its queues'
``status`` all the time, and none of that may cost a review anything. A change the policy
can see is built by the writer, once per burst, and a reader always gets the last
complete policy without waiting for a build."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import labels
from cluster.clock import ManualClock
from cluster.files import load_objects
from tests.builders import KUEUE, cq_obj, flavor_obj, lq_obj
from webhook.kueue_objects import parse_objects, policy_view
from webhook.owners import OwnerKey, OwnerKind
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy
from webhook.source import POLICY_RESOURCES, OwnerStore, PolicyStore

GPU = labels.GPU_RESOURCE
POLICY = Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml"
PLURAL = {
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "ResourceQuota": "resourcequotas",
}


# ---------------------------------------------------------------- builders


def lq(name: str, cq: str = "cq", **annotations: str) -> dict[str, Any]:
    return lq_obj("ns", name, cq, annotations or None)


def cq(name: str = "cq", gpus: int = 8) -> dict[str, Any]:
    return cq_obj(name, {"h100": {GPU: (gpus,)}})


def flavor(name: str = "h100") -> dict[str, Any]:
    return flavor_obj(name, {labels.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"})


def rquota(gpus: str, used: str = "0", ns: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"namespace": ns, "name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": gpus}},
        "status": {"used": {"requests.nvidia.com/gpu": used}},
    }


def wpc(name: str = "batch", value: Any = 100) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def with_status(obj: dict[str, Any], n: int) -> dict[str, Any]:
    """What Kueue writes as workloads come and go: status, resourceVersion, managedFields."""
    changed = copy.deepcopy(obj)
    changed["status"] = {"pendingWorkloads": n, "admittedWorkloads": n % 3}
    changed["metadata"]["resourceVersion"] = str(1000 + n)
    changed["metadata"]["managedFields"] = [{"manager": "kueue", "subresource": "status"}]
    return changed


def listed(*objs: dict[str, Any], debounce_s: float = 0.05) -> PolicyStore:
    """A store whose informers have listed ``objs``."""
    store = PolicyStore(ManualClock(), debounce_s=debounce_s)
    for resource in POLICY_RESOURCES:
        store.replace(resource, [o for o in objs if PLURAL[o["kind"]] == resource])
    return store


def policy_of(store: PolicyStore) -> Policy:
    policy = store.current()
    assert policy is not None
    return policy


# ---------------------------------------------------------------- readiness


def test_no_policy_and_not_ready_until_every_resource_is_listed_then_one_build() -> None:
    store = PolicyStore(ManualClock())
    for resource in POLICY_RESOURCES[:-1]:
        store.replace(resource, [lq("q")] if resource == "localqueues" else [])
        assert not store.synced
        assert store.current() is None
    store.event("localqueues", "ADDED", lq("early"))
    assert store.current() is None

    store.replace(POLICY_RESOURCES[-1], [])
    assert store.synced
    assert store.generation == 1
    assert policy_of(store).local_queue("ns", "early") is not None


def test_a_file_is_built_once_and_equals_reading_it_directly() -> None:
    store = PolicyStore(ManualClock())
    store.load_file(str(POLICY))
    assert store.synced
    assert store.generation == 1
    assert policy_of(store) == policy_from_objects(load_objects(POLICY))


# ---------------------------------------------------------------- what costs a build


@pytest.mark.parametrize(
    "update",
    [
        lambda o: with_status(o, 7),
        lambda o: {**o, "metadata": {**o["metadata"], "labels": {"team": "nlp"}}},
        lambda o: {**o, "metadata": {**o["metadata"], "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{}"}}},
        lambda o: {**o, "metadata": {**o["metadata"], "generation": 2, "uid": "u-1"}},
    ],
    ids=["status", "labels", "other-annotation", "bookkeeping"],
)  # fmt: skip
def test_updates_of_what_the_policy_does_not_read_build_nothing(update: Any) -> None:
    store = listed(flavor(), cq(), lq("q"), wpc(), rquota("4"))
    before = policy_of(store)
    for obj, resource in ((lq("q"), "localqueues"), (cq(), "clusterqueues"),
                          (wpc(), "workloadpriorityclasses"),
                          (rquota("4", used="3"), "resourcequotas")):  # fmt: skip
        store.event(resource, "MODIFIED", update(obj))
    assert store.generation == 1
    assert store.current() is before


def test_a_relist_with_only_status_changes_builds_nothing() -> None:
    queues = [lq(f"q{i}") for i in range(20)]
    store = listed(flavor(), cq(), *queues)
    store.replace("localqueues", [with_status(q, i) for i, q in enumerate(queues)])
    assert store.generation == 1
    store.replace("localqueues", [with_status(q, 1) for q in queues[:-1]])
    assert store.generation == 2
    assert policy_of(store).local_queue("ns", "q19") is None


@pytest.mark.parametrize(
    ("resource", "obj", "seen"),
    [
        ("clusterqueues", cq(gpus=16),
         lambda p: p.limit("cq", "h100", GPU).nominal == 16_000),
        ("localqueues", lq("q", **{labels.DEFAULT_TIME_LIMIT: "2h"}),
         lambda p: p.local_queues[("ns", "q")].settings.default_time_limit_s == 7200),
        ("localqueues", lq("q", cq="other"),
         lambda p: p.local_queues[("ns", "q")].cluster_queue == "other"),
        ("workloadpriorityclasses", wpc(value=200),
         lambda p: p.priority_classes["batch"].value == 200),
        ("localqueues", lq("new"), lambda p: p.local_queue("ns", "new") is not None),
        ("resourcequotas", rquota("2"), lambda p: p.quotas_in("ns")[0].hard == 2),
    ],
    ids=["quota", "queue-annotation", "queue-spec", "priority-value", "new-queue",
         "namespace-quota"],
)  # fmt: skip
def test_a_change_the_policy_reads_is_built_by_the_writer(
    resource: str, obj: dict[str, Any], seen: Any
) -> None:
    store = listed(flavor(), cq(), lq("q"), wpc())
    store.event(resource, "MODIFIED", obj)
    assert store.generation == 2
    assert seen(policy_of(store))


def test_a_value_that_only_looks_equal_is_a_change() -> None:
    store = listed(wpc(value=1))
    store.event("workloadpriorityclasses", "MODIFIED", wpc(value=True))
    assert store.generation == 2
    assert "batch" not in policy_of(store).priority_classes
    assert any("not an integer" in p for p in policy_of(store).problems)


def test_deleting_builds_once_and_deleting_the_unknown_builds_nothing() -> None:
    store = listed(flavor(), cq(), lq("q"))
    store.event("localqueues", "DELETED", lq("ghost"))
    assert store.generation == 1
    store.event("localqueues", "DELETED", with_status(lq("q"), 3))
    assert store.generation == 2
    assert policy_of(store).local_queue("ns", "q") is None


# ---------------------------------------------------------------- readers on the event loop


async def wait_for_generation(store: PolicyStore, generation: int) -> None:
    async with asyncio.timeout(5):
        while True:
            if store.generation >= generation:
                return
            await asyncio.sleep(0.005)


async def test_on_the_event_loop_a_burst_is_one_build_and_readers_never_wait() -> None:
    store = listed(flavor(), cq(), lq("q"), debounce_s=0.02)
    before = policy_of(store)
    for i in range(50):
        store.event("localqueues", "ADDED", lq(f"burst-{i}"))
        store.event("localqueues", "MODIFIED", with_status(lq("q"), i))
        # Between a change and its build, readers get the last complete policy, as is.
        assert store.current() is before
    store.event("clusterqueues", "MODIFIED", cq(gpus=32))
    assert store.current() is before
    assert store.generation == 1

    await wait_for_generation(store, 2)
    after = policy_of(store)
    assert all(after.local_queue("ns", f"burst-{i}") is not None for i in range(50))
    assert after.limit("cq", "h100", GPU).nominal == 32_000
    await asyncio.sleep(0.05)
    assert store.generation == 2  # the whole burst: one build


async def test_a_change_after_a_build_is_built_again() -> None:
    store = listed(flavor(), cq(), lq("q"), debounce_s=0.01)
    store.event("localqueues", "ADDED", lq("a"))
    await wait_for_generation(store, 2)
    store.event("localqueues", "ADDED", lq("b"))
    await wait_for_generation(store, 3)
    assert policy_of(store).queues_in("ns") == ("a", "b", "q")


def test_a_change_left_by_a_loop_that_stopped_is_built_with_the_next() -> None:
    store = listed(flavor(), cq(), lq("q"), debounce_s=0.01)

    async def add(name: str, wait: bool) -> None:
        store.event("localqueues", "ADDED", lq(name))
        if wait:
            await wait_for_generation(store, 2)

    asyncio.run(add("a", wait=False))  # the loop ends before its timer fires
    assert store.generation == 1
    asyncio.run(add("b", wait=True))
    assert policy_of(store).queues_in("ns") == ("a", "b", "q")


async def test_status_churn_on_the_event_loop_schedules_nothing() -> None:
    store = listed(flavor(), cq(), lq("q"), debounce_s=0.01)
    for i in range(100):
        store.event("localqueues", "MODIFIED", with_status(lq("q"), i))
    await asyncio.sleep(0.05)
    assert store.generation == 1


# ---------------------------------------------------------------- the view the store keeps


OBJECTS = load_objects(POLICY)
_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(min_value=0),
    status=_junk,
    extra_metadata=st.dictionaries(
        st.sampled_from(["labels", "uid", "resourceVersion", "managedFields", "generation"]),
        _junk,
    ),
    extra_annotations=st.dictionaries(st.text(max_size=20), st.text(max_size=8), max_size=3),
)
def test_the_view_reads_as_the_whole_object(
    index: int, status: Any, extra_metadata: dict[str, Any], extra_annotations: dict[str, str]
) -> None:
    obj = copy.deepcopy(OBJECTS[index % len(OBJECTS)])
    obj["status"] = status
    obj["metadata"].update(extra_metadata)
    obj["metadata"]["annotations"] = {**extra_annotations,
                                      **obj["metadata"].get("annotations", {})}  # fmt: skip
    assert list(parse_objects([policy_view(obj)])) == list(parse_objects([obj]))


# ---------------------------------------------------------------- owners


def meta_only(namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    """A Job or JobSet as a metadata-only list or watch gives it."""
    metadata: dict[str, Any] = {"namespace": namespace, "name": name}
    if uid is not None:
        metadata["uid"] = uid
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}


JOB_KEY = OwnerKey(OwnerKind.JOB, "team", "train")


def test_the_owner_store_keeps_each_jobs_uid_and_follows_its_watch() -> None:
    store = OwnerStore()
    view = store.view()
    store.replace(
        OwnerKind.JOB,
        [meta_only("team", "train", "u1"), meta_only("team", "no-uid", None)],
    )
    assert (view.uid(JOB_KEY), len(store)) == ("u1", 1)

    # the view a review took reads what the store holds when it is read
    store.event(OwnerKind.JOB, "DELETED", meta_only("team", "train", "u1"))
    assert view.uid(JOB_KEY) is None
    store.event(OwnerKind.JOB, "ADDED", meta_only("team", "train", "u2"))
    assert view.uid(JOB_KEY) == "u2"
    # a late DELETED of the Job that had the name before takes nothing away
    store.event(OwnerKind.JOB, "DELETED", meta_only("team", "train", "u1"))
    assert view.uid(JOB_KEY) == "u2"
    # a JobSet of the same name is another owner
    assert view.uid(OwnerKey(OwnerKind.JOBSET, "team", "train")) is None
    store.replace(OwnerKind.JOB, [])
    assert view.uid(JOB_KEY) is None


def test_a_policy_file_makes_its_jobs_and_jobsets_known_and_nothing_else() -> None:
    store = OwnerStore()
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"namespace": "team", "name": "train", "uid": "u1"}}  # fmt: skip
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"namespace": "team", "name": "pre", "uid": "u2"}}  # fmt: skip
    store.load([*OBJECTS, job, jobset])

    view = store.view()
    assert len(store) == 2
    assert view.uid(JOB_KEY) == "u1"
    assert view.uid(OwnerKey(OwnerKind.JOBSET, "team", "pre")) == "u2"
