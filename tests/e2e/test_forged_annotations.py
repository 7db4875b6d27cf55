"""A ``tessera.dev/gpu-indices`` annotation that a user writes (issue 20): what it can and
cannot make the extender do.

The extender records the GPUs it gives a pod in the Binding, and kube-apiserver copies
the Binding's annotations onto the pod as it binds it, over whatever the pod carried. The
extender's cache reads the annotation of every bound pod as the GPUs that pod holds: that
is how it rebuilds its record after a restart. The user here is a namespace editor: a
ServiceAccount bound to the built-in ``edit`` ClusterRole in the jobs' namespace, as a
team's engineers usually are.
"""

from __future__ import annotations

from typing import Any, Final

import pytest

from cluster import labels
from tests.e2e.fixtures.cluster import E2ECluster, Placement, gpu_conflicts
from tests.e2e.fixtures.install import Identity
from tests.e2e.fixtures.jobs import NAMESPACE, gpu_job, to_yaml
from tests.e2e.fixtures.kubeapi import ApiError, KubeApi

pytestmark = pytest.mark.e2e

NODE: Final = "restart-1"
"""8 GPUs in two NVLink islands of 4: a 4-GPU pod takes one island, the next the other."""
GPUS: Final = 8
EDITOR: Final = Identity(NAMESPACE, "e2e-editor")


class GpuGivenTwice(AssertionError):
    """The extender gave a pod GPUs it had already given another pod."""


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
    created = e2e.create(to_yaml(job))
    assert created.returncode == 0, created.stderr
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


@pytest.mark.xfail(
    strict=True,
    raises=GpuGivenTwice,
    reason="hole (issue 20): a pod's editor may rewrite tessera.dev/gpu-indices after "
    "binding (pods UPDATE is allowed by the webhook's update rule), and the extender's "
    "cache takes the new value, so the GPUs the pod was given look free",
)
def test_an_editor_rewriting_gpu_indices_does_not_free_the_gpus_the_pod_was_given(
    scheduling: E2ECluster, editor: KubeApi
) -> None:
    e2e = scheduling
    first = _bound(e2e, gpu_job("indices-held", gpus=4, node=NODE))
    elsewhere = [i for i in range(GPUS) if i not in first.indices]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{first.name}"
    try:
        editor.merge_patch(path, {"metadata": {"annotations": {
            labels.GPU_INDICES: _indices(elsewhere)}}})  # fmt: skip
    except ApiError as exc:
        if exc.status not in (400, 403, 422):  # refusing the rewrite keeps the record true
            raise

    second = _bound(e2e, gpu_job("indices-next", gpus=4, node=NODE))

    if not set(second.indices).isdisjoint(first.indices):
        raise GpuGivenTwice(
            f"pod {second.name} was given GPUs {list(second.indices)} of {NODE}, which the "
            f"extender had given {first.name} ({list(first.indices)}) before its "
            f"{labels.GPU_INDICES} was rewritten to {_indices(elsewhere)}"
        )
