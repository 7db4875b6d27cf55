"""Metadata a user writes where Tessera writes its own (issue 20): what a forged
``tessera.dev/gpu-indices`` annotation or ``tessera.dev/gang`` label can and cannot make
the extender do.

The extender records the GPUs it gives a pod in the Binding, and kube-apiserver copies
the Binding's annotations onto the pod as it binds it, over whatever the pod carried. The
extender's cache reads the annotation of every bound pod as the GPUs that pod holds: that
is how it rebuilds its record after a restart. It reads a pod's gang from its
``tessera.dev/gang`` label, which the webhook writes as ``<namespace>.<job>`` unless the
workload already has one. The user here is a namespace editor: a ServiceAccount bound to
the built-in ``edit`` ClusterRole in the jobs' namespace, as a team's engineers usually
are.
"""

from __future__ import annotations

from typing import Any, Final

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import GANG_POOL
from loadtest.stack.install import Identity
from loadtest.stack.jobs import IMAGE, NAMESPACE, OTHER_NAMESPACE, gpu_job, to_yaml
from loadtest.stack.kubeapi import ApiError, KubeApi, WaitTimeoutError
from loadtest.stack.placements import Placement, gpu_conflicts

pytestmark = pytest.mark.e2e

NODE: Final = "restart-1"
"""8 GPUs in two NVLink islands of 4: a 4-GPU pod takes one island, the next the other."""
GPUS: Final = 8
EDITOR: Final = Identity(NAMESPACE, "e2e-editor")


class GpuGivenTwice(AssertionError):
    """The extender gave a pod GPUs it had already given another pod."""


class GangSteeredFromOutside(AssertionError):
    """A pod of another namespace decided where a gang may run."""


@pytest.fixture(scope="module")
def editor(e2e: E2ECluster) -> KubeApi:
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": EDITOR.name, "namespace": EDITOR.namespace},
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{EDITOR.name}-edit", "namespace": EDITOR.namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [
            {"kind": "ServiceAccount", "name": EDITOR.name, "namespace": EDITOR.namespace}
        ],
    }
    e2e.kubectl("apply", "-f", "-", stdin=to_yaml(account, binding))
    return e2e.api_as(EDITOR)


def _bound(e2e: E2ECluster, job: dict[str, Any]) -> Placement:
    e2e.create_stored(job)
    [placement] = e2e.wait_bound(job["metadata"]["name"], 1)
    return placement


def _with_template_annotation(job: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    job["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {})[key] = value
    return job


def _indices(values: tuple[int, ...] | list[int]) -> str:
    return ",".join(map(str, values))


def test_gpu_indices_written_in_a_pod_template_are_replaced_by_the_binding(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    first = _bound(e2e, gpu_job("indices-first", gpus=4, node=NODE))
    # the second job's pods claim, before they are bound, the GPUs the first one holds
    forged = _with_template_annotation(
        gpu_job("indices-forged", gpus=4, node=NODE), labels.GPU_INDICES, _indices(first.indices)
    )

    second = _bound(e2e, forged)

    assert second.node == NODE
    assert set(second.indices).isdisjoint(first.indices), (first, second)
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []


def test_an_editor_rewriting_gpu_indices_does_not_free_the_gpus_the_pod_was_given(
    scheduling: E2ECluster, editor: KubeApi
) -> None:
    e2e = scheduling
    first = _bound(e2e, gpu_job("indices-held", gpus=4, node=NODE))
    elsewhere = [i for i in range(GPUS) if i not in first.indices]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{first.name}"
    with pytest.raises(ApiError) as refused:
        editor.merge_patch(path, {"metadata": {"annotations": {
            labels.GPU_INDICES: _indices(elsewhere)}}})  # fmt: skip
    # the webhook refuses the rewrite, saying why
    assert refused.value.status == 422
    assert f"annotation {labels.GPU_INDICES} cannot change" in str(refused.value)

    second = _bound(e2e, gpu_job("indices-next", gpus=4, node=NODE))

    if not set(second.indices).isdisjoint(first.indices):
        raise GpuGivenTwice(
            f"pod {second.name} was given GPUs {list(second.indices)} of {NODE}, which the "
            f"extender had given {first.name} ({list(first.indices)}) before its "
            f"{labels.GPU_INDICES} was rewritten to {_indices(elsewhere)}"
        )


"""Another team's namespace: no queue, and not one the webhook manages (its default)."""
VICTIM: Final = "victim"


def _gang_impostor(gang: str, namespace: str) -> dict[str, Any]:
    """A pod anyone who may create pods in their own namespace can write: the label of a
    gang of ``NAMESPACE``, the extender's scheduler, one 4-GPU pod on the one node of rack
    a (which holds two such pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "impostor",
            "namespace": namespace,
            "labels": {labels.GANG: gang},
            "annotations": {labels.GANG_SIZE: "2"},
        },
        "spec": {
            "schedulerName": labels.DEFAULT_SCHEDULER_NAME,
            "nodeSelector": {labels.HOSTNAME: "gang-a1"},
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"limits": {labels.GPU_RESOURCE: 4}}}
            ],
        },
    }


def _victim_placed(e2e: E2ECluster) -> list[Placement]:
    """The gang a pod elsewhere claims to belong to: with rack a half taken, it fits in
    rack b, unless the impostor counts as a member placed in rack a."""
    rack = {labels.TOPOLOGY: "required:rack"}
    e2e.create_stored(gpu_job(VICTIM, pods=2, gpus=4, pool=GANG_POOL, annotations=rack))
    try:
        return e2e.wait_bound(VICTIM, 2, timeout=30)
    except WaitTimeoutError as exc:
        raise GangSteeredFromOutside(
            f"gang {NAMESPACE}.{VICTIM} (required:rack) is held to the rack of a pod of "
            f"another namespace, which carries its label: {exc}"
        ) from None


def test_the_webhook_refuses_a_pod_naming_another_namespaces_gang(e2e: E2ECluster) -> None:
    with pytest.raises(ApiError) as refused:
        e2e.api.create(
            f"/api/v1/namespaces/{OTHER_NAMESPACE}/pods",
            _gang_impostor(f"{NAMESPACE}.{VICTIM}", OTHER_NAMESPACE),
        )
    assert refused.value.status == 422
    assert f"names a gang outside namespace {OTHER_NAMESPACE}" in str(refused.value)


def test_a_pod_the_webhook_never_sees_does_not_join_another_namespaces_gang(
    scheduling: E2ECluster,
) -> None:
    # kube-system is outside the webhook's namespaceSelector: the extender itself must not
    # count a pod there as a member of a gang of e2e-ml
    e2e = scheduling
    try:
        e2e.api.create(
            "/api/v1/namespaces/kube-system/pods",
            _gang_impostor(f"{NAMESPACE}.{VICTIM}", "kube-system"),
        )
        e2e.api.watch_until(
            "the impostor bound",
            "/api/v1/namespaces/kube-system/pods",
            lambda pod: bool(pod["spec"].get("nodeName")),
        )
        placed = _victim_placed(e2e)
        assert {e2e.fleet[p.node].rack for p in placed} == {"rack-b"}, placed
        assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
    finally:
        e2e.api.request(
            "DELETE",
            "/api/v1/namespaces/kube-system/pods/impostor",
            query={"gracePeriodSeconds": "0"},
        )
