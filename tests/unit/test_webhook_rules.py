"""The ten admission rules, one table each (allowed and denied), the UPDATE checks, and
``admit`` composing them: what a user sees in the mutated object or the denial message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import labels
from cluster.model import Taint, product_matches
from tests.builders import cq_obj, flavor_obj, lq_obj, topology_obj, wpc_obj
from webhook.admit import admit, check_update
from webhook.patch import Draft, clone, diff
from webhook.policy_build import policy_from_objects
from webhook.queues import Flavor, Policy, parse_toleration
from webhook.rules.gang import gang_id, name_gang, rule_gang, rule_quota
from webhook.rules.outcome import AdmitConfig, Allowed, Denied, FlavorChoice, QueueChoice
from webhook.rules.placement import merge_required_affinity, rule_flavors, rule_topology
from webhook.rules.queue import (
    rule_priority,
    rule_queue,
    rule_scheduler,
    rule_suspend,
    rule_time_limit,
)
from webhook.workload import (
    GroupVersionKind,
    GroupVersionResource,
    ReviewRequest,
    Workload,
    WorkloadKind,
    workload_from_object,
)

GPU = labels.GPU_RESOURCE
MILLI = labels.GPU_MILLI_RESOURCE
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
X = "\N{MULTIPLICATION SIGN}"
"""How rejection messages write pods times GPUs per pod."""
SPOT = {"key": "cloud.example.com/spot", "value": "true", "effect": "NoSchedule"}

# ---------------------------------------------------------------- the policy under test


def make_policy() -> Policy:
    """research (cohort c): h100-reserved 16+16, h100-spot 8, a100 8 and 4000 milli;
    vision (cohort c): h100-reserved 16 lending 8, h100-spot 8, max 24 GPUs per job;
    sandbox (no cohort): a100 2 and 2000 milli; open: a flavor with no node labels."""
    cap = "cloud.example.com/capacity"
    return policy_from_objects(
        [
            topology_obj("gpu", ["example.com/block", "example.com/rack", labels.HOSTNAME]),
            flavor_obj(
                "h100-reserved",
                {labels.GFD_PRODUCT: H100, cap: "reserved"},
                tessera_topology="gpu",
            ),
            flavor_obj(
                "h100-spot",
                {labels.GFD_PRODUCT: H100, cap: "spot"},
                taints=[SPOT],
                tessera_topology="gpu",
            ),
            # topology mode B: Kueue's topology-aware scheduling places by it
            flavor_obj("h100-tas", {labels.GFD_PRODUCT: H100, cap: "tas"}, topology="gpu"),
            flavor_obj("a100", {labels.GFD_PRODUCT: A100}),
            flavor_obj("anywhere"),
            cq_obj(
                "research",
                {
                    "h100-reserved": {GPU: (16, 16)},
                    "h100-spot": {GPU: (8,)},
                    "a100": {GPU: (8,), MILLI: (4000,)},
                },
                cohort="c",
                annotations={
                    labels.DEFAULT_PRIORITY_CLASS: "low",
                    labels.DEFAULT_TIME_LIMIT: "4h",
                    labels.MAX_TIME_LIMIT: "24h",
                },
            ),
            cq_obj(
                "vision",
                {"h100-reserved": {GPU: (16, None, 8)}, "h100-spot": {GPU: (8,)}},
                cohort="c",
                annotations={labels.MAX_GPUS_PER_JOB: "24"},
            ),
            cq_obj("sandbox", {"a100": {GPU: (2,), MILLI: (2000,)}}),
            cq_obj("open", {"anywhere": {GPU: (8,)}}),
            lq_obj("team", "research", "research"),
            lq_obj("team", "vision", "vision"),
            lq_obj("team", "open", "open"),
            lq_obj("team", "broken", "ghost"),
            lq_obj("team", "odd-default", "research", {labels.DEFAULT_PRIORITY_CLASS: "urgent"}),
            lq_obj("lab", "sandbox", "sandbox", {labels.DEFAULT_QUEUE: "true"}),
            wpc_obj("low", 100),
            wpc_obj("high", 1000),
        ]
    )


POLICY = make_policy()
CONFIG = AdmitConfig(managed_namespaces=frozenset({"strict", "team"}))


# ---------------------------------------------------------------- builders of workloads


def container(gpus: int | None = 4, milli: int | None = None, name: str = "c") -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": "2"}
    if gpus is not None:
        limits[GPU] = str(gpus)
    if milli is not None:
        limits[MILLI] = str(milli)
    return {"name": name, "image": "img", "resources": {"limits": limits}}


def _meta(  # noqa: PLR0917  # a private builder mirroring metadata's fields
    name: str | None,
    generate_name: str | None,
    namespace: str,
    queue: str | None,
    extra_labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace}
    if name is not None:
        meta["name"] = name
    if generate_name is not None:
        meta["generateName"] = generate_name
    object_labels = dict(extra_labels or {})
    if queue is not None:
        object_labels[labels.QUEUE_NAME] = queue
    if object_labels:
        meta["labels"] = object_labels
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def pod_spec(gpus: int | None = 4, milli: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"containers": [container(gpus, milli)], "restartPolicy": "Never", **extra}


def job(
    *,
    gpus: int | None = 4,
    milli: int | None = None,
    parallelism: int | None = 2,
    name: str | None = "train",
    generate_name: str | None = None,
    namespace: str = "team",
    queue: str | None = "research",
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    template_meta: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **template_spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"template": {"spec": pod_spec(gpus, milli, **template_spec)}}
    if template_meta is not None:
        body["template"]["metadata"] = template_meta
    if parallelism is not None:
        body["parallelism"] = parallelism
    body.update(spec or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(name, generate_name, namespace, queue, extra_labels, annotations),
        "spec": body,
    }


def jobset(
    members: list[tuple[str, int, int, int | None]],
    *,
    name: str = "pretrain",
    namespace: str = "team",
    queue: str | None = "research",
    annotations: Mapping[str, str] | None = None,
    job_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``members``: (replicated job name, replicas, parallelism, GPUs per pod or None)."""
    replicated = [
        {
            "name": rname,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": parallelism,
                    "template": {"spec": pod_spec(gpus)},
                    **(job_spec or {}),
                }
            },
        }
        for rname, replicas, parallelism, gpus in members
    ]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _meta(name, None, namespace, queue, None, annotations),
        "spec": {"replicatedJobs": replicated},
    }


def pod(
    *,
    gpus: int | None = 1,
    milli: int | None = None,
    name: str = "notebook",
    namespace: str = "team",
    queue: str | None = "research",
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta = _meta(name, None, namespace, queue, extra_labels, annotations)
    if owners:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": pod_spec(gpus, milli, **spec),
    }


_KINDS = {
    "Job": (GroupVersionKind("batch", "v1", "Job"), WorkloadKind.JOB, "jobs"),
    "JobSet": (GroupVersionKind("jobset.x-k8s.io", "v1alpha2", "JobSet"), WorkloadKind.JOBSET,
               "jobsets"),
    "Pod": (GroupVersionKind("", "v1", "Pod"), WorkloadKind.POD, "pods"),
}  # fmt: skip


def request(
    obj: Mapping[str, Any],
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    uid: str = "3f9a1c52-0000-4000-8000-000000000001",
) -> ReviewRequest:
    gvk, _, resource = _KINDS[obj["kind"]]
    return ReviewRequest(
        uid=uid,
        kind=gvk,
        resource=GroupVersionResource(gvk.group, gvk.version, resource),
        operation=operation,
        namespace=obj["metadata"].get("namespace", ""),
        name=obj["metadata"].get("name", ""),
        object=obj,
        old_object=old,
    )


def wl(obj: Mapping[str, Any]) -> Workload:
    return workload_from_object(obj, _KINDS[obj["kind"]][1])


def queue(name: str = "research", namespace: str = "team") -> QueueChoice:
    local = POLICY.local_queue(namespace, name)
    assert local is not None
    cluster = POLICY.cluster_queue(local.cluster_queue)
    assert cluster is not None
    return QueueChoice(local, cluster)


def flavors(*names: str) -> tuple[Flavor, ...]:
    found = tuple(POLICY.flavor(n) for n in names)
    assert all(found)
    return found  # type: ignore[return-value]


def at(obj: Mapping[str, Any], *path: str | int) -> Any:
    node: Any = obj
    for token in path:
        node = node[int(token)] if isinstance(node, list) else node.get(token)
        if node is None:
            return None
    return node


def tolerates_all(tolerations: list[dict[str, Any]], taints: list[Taint]) -> bool:
    """Whether the JSON ``tolerations`` tolerate every taint, as kube-scheduler judges it."""
    parsed = [parse_toleration(t) for t in tolerations]
    return all(any(t.tolerates(taint) for t in parsed) for taint in taints)


def denied(result: object, code: int, *fragments: str) -> None:
    """The result is a denial with this code whose message holds every fragment."""
    assert isinstance(result, Denied), result
    assert result.code == code, result.message
    for fragment in fragments:
        assert fragment in result.message, result.message


# ---------------------------------------------------------------- rule 1: queue


@pytest.mark.parametrize(
    ("obj", "config", "expected", "defaulted"),
    [
        pytest.param(job(), CONFIG, "research", False, id="named-queue"),
        pytest.param(job(queue="vision"), CONFIG, "vision", False, id="another-queue"),
        pytest.param(job(namespace="lab", queue=None), CONFIG, "sandbox", True,
                     id="marked-default"),
        pytest.param(job(namespace="free", queue=None), CONFIG, None, False,
                     id="unmanaged-no-queue"),
        pytest.param(
            job(namespace="lab", queue=None), AdmitConfig(managed_namespaces=frozenset({"*"})),
            "sandbox", True, id="all-managed-default-still-used",
        ),
    ],
)  # fmt: skip
def test_rule_queue_allows(
    obj: dict[str, Any], config: AdmitConfig, expected: str | None, defaulted: bool
) -> None:
    out = Draft(obj)
    result = rule_queue(wl(obj), POLICY, config, out)
    if expected is None:
        assert result is None
        assert out.root == obj
        return
    assert isinstance(result, QueueChoice)
    assert (result.local.name, result.defaulted) == (expected, defaulted)
    assert out.root["metadata"]["labels"][labels.QUEUE_NAME] == expected


@pytest.mark.parametrize(
    ("obj", "config", "fragments"),
    [
        pytest.param(
            job(queue="reserch"), CONFIG,
            ["LocalQueue 'reserch'", "does not exist in namespace team",
             "queues in namespace team: broken, odd-default, open, research, vision"],
            id="unknown-queue",
        ),
        pytest.param(
            job(namespace="empty", queue="q"), CONFIG,
            ["namespace empty has no LocalQueue; ask your cluster admin"], id="no-queues-at-all",
        ),
        pytest.param(
            job(queue=None), CONFIG,
            ["has no kueue.x-k8s.io/queue-name label", "namespace team has no default queue",
             "one of the queues in namespace team: broken"],
            id="managed-without-default",
        ),
        pytest.param(
            job(namespace="free", queue=None), AdmitConfig(managed_namespaces=frozenset({"*"})),
            ["namespace free has no default queue"], id="star-manages-every-namespace",
        ),
        pytest.param(
            job(queue="broken"), CONFIG,
            ["LocalQueue broken in namespace team points at ClusterQueue ghost, which does not "
             "exist", "or use another queue (odd-default, open, research, vision)"],
            id="cluster-queue-missing",
        ),
    ],
)  # fmt: skip
def test_rule_queue_denies(obj: dict[str, Any], config: AdmitConfig, fragments: list[str]) -> None:
    denied(rule_queue(wl(obj), POLICY, config, Draft(obj)), 403, *fragments)


# ---------------------------------------------------------------- rule 2: suspend


@pytest.mark.parametrize(
    ("obj", "path", "expected"),
    [
        pytest.param(job(), ("spec", "suspend"), True, id="job-absent"),
        pytest.param(job(spec={"suspend": False}), ("spec", "suspend"), True, id="job-false"),
        pytest.param(job(spec={"suspend": True}), ("spec", "suspend"), True, id="job-true"),
        pytest.param(jobset([("w", 1, 2, 4)]), ("spec", "suspend"), True, id="jobset"),
        pytest.param(pod(), ("spec", "schedulingGates"),
                     [{"name": labels.KUEUE_ADMISSION_GATE}], id="pod-gate"),
        pytest.param(pod(schedulingGates=[{"name": "other"}]), ("spec", "schedulingGates"),
                     [{"name": "other"}, {"name": labels.KUEUE_ADMISSION_GATE}],
                     id="pod-other-gate-kept"),
        pytest.param(pod(schedulingGates=[{"name": labels.KUEUE_ADMISSION_GATE}]),
                     ("spec", "schedulingGates"), [{"name": labels.KUEUE_ADMISSION_GATE}],
                     id="pod-already-gated"),
    ],
)  # fmt: skip
def test_rule_suspend_holds_the_workload_for_kueue(
    obj: dict[str, Any], path: tuple[str, ...], expected: Any
) -> None:
    out = Draft(obj)
    assert rule_suspend(wl(obj), out) == ()
    assert at(out.root, *path) == expected


# ---------------------------------------------------------------- rule 3: priority


@pytest.mark.parametrize(
    ("obj", "choice", "label", "warning"),
    [
        pytest.param(job(extra_labels={labels.PRIORITY_CLASS: "high"}), queue(), "high", None,
                     id="named-class-kept"),
        pytest.param(job(), queue(), "low", "priority class set to low, the default of queue "
                     "research", id="queue-default"),
        pytest.param(job(queue="vision"), queue("vision"), None, None, id="no-default"),
        pytest.param(job(queue="odd-default"), queue("odd-default"), None,
                     "the default priority class urgent of queue odd-default does not exist",
                     id="default-missing-warns"),
    ],
)  # fmt: skip
def test_rule_priority_allows(
    obj: dict[str, Any], choice: QueueChoice, label: str | None, warning: str | None
) -> None:
    out = Draft(obj)
    notes = rule_priority(wl(obj), choice, POLICY, out)
    assert isinstance(notes, tuple)
    assert at(out.root, "metadata", "labels", labels.PRIORITY_CLASS) == label
    assert any(warning in n for n in notes) if warning else notes == ()


@pytest.mark.parametrize("klass", ["urgent", "", "Low"])
def test_rule_priority_denies_a_class_that_does_not_exist(klass: str) -> None:
    obj = job(extra_labels={labels.PRIORITY_CLASS: klass})
    denied(
        rule_priority(wl(obj), queue(), POLICY, Draft(obj)),
        403,
        f"WorkloadPriorityClass {klass!r}",
        "use one of: high, low",
        "remove the label to get the default of queue research (ClusterQueue research)",
    )


# ---------------------------------------------------------------- rule 4: flavors


@pytest.mark.parametrize(
    ("accepted", "product", "matches"),
    [
        ("H100", H100, True),
        ("h100", H100, True),
        ("H100-80GB", H100, True),
        (H100, H100, True),
        (H100.lower(), H100, True),
        ("H10", H100, False),
        ("A100", H100, False),
        ("80GB-H100", H100, False),
        ("A100", A100, True),
        ("NVIDIA", A100, True),
    ],
)
def test_gpu_products_match_whole_parts_of_the_gfd_label(
    accepted: str, product: str, matches: bool
) -> None:
    assert product_matches(accepted, product) is matches


RESERVED_TERM = {
    "matchExpressions": [
        {"key": "cloud.example.com/capacity", "operator": "In", "values": ["reserved"]},
        {"key": labels.GFD_PRODUCT, "operator": "In", "values": [H100]},
    ]
}
SPOT_TERM = {
    "matchExpressions": [
        {"key": "cloud.example.com/capacity", "operator": "In", "values": ["spot"]},
        {"key": labels.GFD_PRODUCT, "operator": "In", "values": [H100]},
    ]
}
A100_TERM = {"matchExpressions": [{"key": labels.GFD_PRODUCT, "operator": "In", "values": [A100]}]}


@pytest.mark.parametrize(
    ("obj", "choice", "allowed", "terms"),
    [
        pytest.param(job(), queue(), ["h100-reserved", "h100-spot", "a100"],
                     [RESERVED_TERM, SPOT_TERM, A100_TERM], id="everything-the-queue-offers"),
        pytest.param(job(annotations={labels.GPU_PRODUCT: "H100"}), queue(),
                     ["h100-reserved", "h100-spot"], [RESERVED_TERM, SPOT_TERM], id="h100"),
        pytest.param(job(annotations={labels.GPU_PRODUCT: " a100 | B200 "}), queue(), ["a100"],
                     [A100_TERM], id="a100-or-b200"),
        pytest.param(job(gpus=None, milli=500), queue(), ["a100"], [A100_TERM],
                     id="shares-only-where-share-quota"),
        pytest.param(job(queue="open"), queue("open"), ["anywhere"], None,
                     id="flavor-without-labels-adds-no-affinity"),
    ],
)  # fmt: skip
def test_rule_flavors_steers_gpu_pods_to_the_allowed_flavors(
    obj: dict[str, Any], choice: QueueChoice, allowed: list[str], terms: list[Any] | None
) -> None:
    out = Draft(obj)
    result = rule_flavors(wl(obj), choice, POLICY, out)
    assert isinstance(result, FlavorChoice)
    assert [f.name for f in result.flavors] == allowed
    spec = out.root["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec
    affinity = at(
        spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    assert (affinity["nodeSelectorTerms"] if affinity else None) == terms
    spot = Taint(SPOT["key"], SPOT["value"], SPOT["effect"])
    assert tolerates_all(spec.get("tolerations", []), [spot]) is ("h100-spot" in allowed)


def test_rule_flavors_leaves_cpu_only_members_alone() -> None:
    obj = jobset([("workers", 2, 2, 4), ("driver", 1, 1, None)])
    out = Draft(obj)
    assert isinstance(rule_flavors(wl(obj), queue(), POLICY, out), FlavorChoice)
    workers, driver = (
        r["template"]["spec"]["template"]["spec"] for r in out.root["spec"]["replicatedJobs"]
    )
    assert "affinity" in workers
    assert "tolerations" in workers
    assert "affinity" not in driver
    assert "tolerations" not in driver


def test_rule_flavors_warns_about_tolerations_and_adds_each_once() -> None:
    obj = job(tolerations=[{"key": "other", "operator": "Exists"}])
    out = Draft(obj)
    result = rule_flavors(wl(obj), queue(), POLICY, out)
    assert isinstance(result, FlavorChoice)
    assert result.warnings == (
        "tolerations added for the taints of flavors h100-spot: pods may run on those nodes",
    )
    tolerations = out.root["spec"]["template"]["spec"]["tolerations"]
    assert tolerations == [
        {"key": "other", "operator": "Exists"},
        {"key": SPOT["key"], "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    ]
    again = Draft(out.root)
    second = rule_flavors(wl(out.root), queue(), POLICY, again)
    assert isinstance(second, FlavorChoice)
    assert second.warnings == ()
    assert again.root == out.root


def test_an_existing_toleration_that_covers_the_taint_is_enough() -> None:
    obj = job(tolerations=[{"key": SPOT["key"], "operator": "Exists"}])
    out = Draft(obj)
    rule_flavors(wl(obj), queue(), POLICY, out)
    assert out.root["spec"]["template"]["spec"]["tolerations"] == [
        {"key": SPOT["key"], "operator": "Exists"}
    ]


@pytest.mark.parametrize(
    ("obj", "choice", "code", "fragments"),
    [
        pytest.param(job(annotations={labels.GPU_PRODUCT: "B200|GB200"}), queue(), 403,
                     ["accepts GPU products B200 or GB200 (annotation tessera.dev/gpu-product)",
                      f"offers h100-reserved ({H100}), h100-spot ({H100}), a100 ({A100})",
                      "change the annotation or use a queue that offers those GPUs"],
                     id="no-flavor-of-that-product"),
        pytest.param(job(annotations={labels.GPU_PRODUCT: " | "}), queue(), 422,
                     ["annotation tessera.dev/gpu-product is empty"], id="empty-product-list"),
        pytest.param(job(queue="vision", gpus=None, milli=500), queue("vision"), 403,
                     ["queue vision (ClusterQueue vision) has no flavor with quota for "
                      "tessera.dev/gpu-milli"], id="no-share-quota"),
        pytest.param(job(queue="open", annotations={labels.GPU_PRODUCT: "H100"}), queue("open"),
                     403, ["offers anywhere (no GPU product label)"],
                     id="flavor-without-product-matches-no-product"),
    ],
)  # fmt: skip
def test_rule_flavors_denies(
    obj: dict[str, Any], choice: QueueChoice, code: int, fragments: list[str]
) -> None:
    denied(rule_flavors(wl(obj), choice, POLICY, Draft(obj)), code, *fragments)


ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
ZONE_B = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
F1 = {"matchExpressions": [{"key": "f", "operator": "In", "values": ["1"]}]}
F2 = {"matchExpressions": [{"key": "f", "operator": "In", "values": ["2"]}]}
BY_NAME = [{"key": "metadata.name", "operator": "In", "values": ["n"]}]


def _and(term: dict[str, Any], flavor: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": term["matchExpressions"] + flavor["matchExpressions"]}


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        pytest.param(None, [F1, F2], id="no-user-affinity"),
        pytest.param([], [F1, F2], id="empty-term-list"),
        pytest.param([ZONE_A], [_and(ZONE_A, F1), _and(ZONE_A, F2)], id="one-user-term"),
        pytest.param([ZONE_A, ZONE_B],
                     [_and(ZONE_A, F1), _and(ZONE_A, F2), _and(ZONE_B, F1), _and(ZONE_B, F2)],
                     id="user-or-times-flavor-or"),
        pytest.param([F1], [F1], id="user-term-already-implies-a-flavor"),
        pytest.param([_and(ZONE_A, F2), ZONE_B],
                     [_and(ZONE_A, F2), _and(ZONE_B, F1), _and(ZONE_B, F2)], id="partly-merged"),
        pytest.param([{}], [{}], id="empty-term-matches-nothing-and-stays"),
        pytest.param([{"matchFields": BY_NAME}],
                     [{"matchFields": BY_NAME, **F1}, {"matchFields": BY_NAME, **F2}],
                     id="match-fields-kept"),
    ],
)  # fmt: skip
def test_user_affinity_is_anded_with_the_flavors(
    user: list[Any] | None, expected: list[Any]
) -> None:
    spec: dict[str, Any] = {}
    if user is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user}
            },
            "podAffinity": {"kept": True},
        }
    original = clone(spec)
    draft = Draft(spec)
    merge_required_affinity(draft, (), [F1, F2])
    assert spec == original  # the draft never writes into what it was given
    spec = draft.root
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == expected
    if user is not None:
        assert spec["affinity"]["podAffinity"] == {"kept": True}
    again = Draft(spec)
    merge_required_affinity(again, (), [F1, F2])
    assert again.root == spec


# A node-selector evaluator, as kube-scheduler reads required node affinity, to check that
# the merge means (user) AND (flavor 1 OR flavor 2) on every node.
def _expr_matches(expr: Mapping[str, Any], node: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in node and node[key] in values
    if op == "NotIn":
        return key not in node or node[key] not in values
    if op == "Exists":
        return key in node
    return key not in node  # DoesNotExist


def _selects(terms: Sequence[Mapping[str, Any]], node: Mapping[str, str]) -> bool:
    return any(
        bool(t.get("matchExpressions"))
        and all(_expr_matches(e, node) for e in t["matchExpressions"])
        for t in terms
    )


_keys = st.sampled_from(["a", "b", "c"])
_values = st.sampled_from(["1", "2"])
_exprs = st.one_of(
    st.builds(lambda k, v: {"key": k, "operator": "In", "values": [v]}, _keys, _values),
    st.builds(lambda k, v: {"key": k, "operator": "NotIn", "values": [v]}, _keys, _values),
    st.builds(lambda k: {"key": k, "operator": "Exists"}, _keys),
    st.builds(lambda k: {"key": k, "operator": "DoesNotExist"}, _keys),
)
_terms = st.lists(
    st.builds(lambda es: {"matchExpressions": es}, st.lists(_exprs, max_size=3)), max_size=3
)
_flavor_terms = st.lists(
    st.builds(
        lambda d: {
            "matchExpressions": [
                {"key": k, "operator": "In", "values": [v]} for k, v in sorted(d.items())
            ]
        },
        st.dictionaries(_keys, _values, min_size=1),
    ),
    min_size=1,
    max_size=3,
)
_nodes = st.lists(st.dictionaries(_keys, _values), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(user=_terms, flavor=_flavor_terms, nodes=_nodes)
def test_merged_affinity_selects_exactly_user_and_any_flavor(
    user: list[dict[str, Any]], flavor: list[dict[str, Any]], nodes: list[dict[str, str]]
) -> None:
    spec: dict[str, Any] = {}
    if user:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": clone(user)}
            }
        }
    draft = Draft(spec)
    merge_required_affinity(draft, (), flavor)
    spec = draft.root
    merged = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for node in nodes:
        user_ok = _selects(user, node) if user else True
        assert _selects(merged["nodeSelectorTerms"], node) == (user_ok and _selects(flavor, node))
    again = Draft(spec)
    merge_required_affinity(again, (), flavor)
    assert again.root == spec


# ---------------------------------------------------------------- rule 5: quota


ALL_GPU = flavors("h100-reserved", "h100-spot", "a100")


@pytest.mark.parametrize(
    ("obj", "choice", "allowed_flavors"),
    [
        pytest.param(job(parallelism=3, gpus=8), queue(), ALL_GPU, id="24-of-24"),
        pytest.param(job(parallelism=0, gpus=8), queue(), ALL_GPU, id="zero-pods"),
        pytest.param(job(parallelism=8, gpus=None, milli=500), queue(), flavors("a100"),
                     id="shares-4000-milli"),
        pytest.param(jobset([("w", 2, 2, 4), ("ps", 1, 1, 8), ("d", 1, 1, None)]), queue(),
                     ALL_GPU, id="jobset-24"),
        pytest.param(job(queue="vision", parallelism=3, gpus=8), queue("vision"),
                     flavors("h100-reserved"), id="max-gpus-per-job-exactly"),
    ],
)  # fmt: skip
def test_rule_quota_allows(
    obj: dict[str, Any], choice: QueueChoice, allowed_flavors: tuple[Flavor, ...]
) -> None:
    assert rule_quota(wl(obj), choice, allowed_flavors, POLICY) == ()


@pytest.mark.parametrize(
    ("obj", "choice", "allowed_flavors", "message"),
    [
        pytest.param(
            job(parallelism=5, gpus=8), queue(), ALL_GPU,
            f"job train asks for 40 GPUs (5 pods {X} 8); queue research (ClusterQueue research) "
            f"can get at most 24 GPUs in flavor h100-reserved ({H100}): nominal 16 + borrowable 8 "
            "(what the rest of cohort c can lend); ask for fewer GPUs or use a queue with more "
            "quota",
            id="over-the-cohort",
        ),
        pytest.param(
            job(parallelism=3, gpus=4, annotations={labels.GPU_PRODUCT: "A100"}), queue(),
            flavors("a100"),
            f"asks for 12 GPUs (3 pods {X} 4); queue research (ClusterQueue research) can get at "
            f"most 8 GPUs in flavor a100 ({A100}): nominal 8 + borrowable 0 (what the rest of "
            "cohort c can lend)",
            id="only-a100-accepted",
        ),
        pytest.param(
            job(namespace="lab", queue="sandbox", parallelism=1, gpus=4), queue("sandbox", "lab"),
            flavors("a100"),
            "can get at most 2 GPUs in flavor a100 (NVIDIA-A100-SXM4-80GB): nominal 2 + "
            "borrowable 0 (ClusterQueue sandbox is in no cohort)",
            id="no-cohort",
        ),
        pytest.param(
            job(parallelism=9, gpus=None, milli=500), queue(), flavors("a100"),
            f"job train asks for 4500 milli-GPUs (9 pods {X} 500); queue research (ClusterQueue "
            "research) can get at most 4000 milli-GPUs in flavor a100",
            id="shares",
        ),
        pytest.param(
            jobset([("workers", 4, 2, 4), ("driver", 1, 1, None)]), queue(), ALL_GPU,
            f"jobset pretrain asks for 32 GPUs (workers: 8 pods {X} 4); queue research",
            id="jobset",
        ),
        pytest.param(
            job(queue="vision", parallelism=4, gpus=8), queue("vision"), flavors("h100-reserved"),
            f"job train asks for 32 GPUs (4 pods {X} 8); queue vision (ClusterQueue vision) allows "
            "at most 24 GPUs per job (tessera.dev/max-gpus-per-job); ask for fewer GPUs or use "
            "another queue",
            id="max-gpus-per-job",
        ),
        pytest.param(
            job(queue="vision", parallelism=1, gpus=40, name=None, generate_name="big-"),
            queue("vision"), flavors("h100-reserved"),
            f"job big-* asks for 40 GPUs (1 pod {X} 40); queue vision (ClusterQueue vision) can "
            f"get at most 32 GPUs in flavor h100-reserved ({H100}): nominal 16 + borrowable 16",
            id="generated-name",
        ),
    ],
)  # fmt: skip
def test_rule_quota_denies_with_the_numbers(
    obj: dict[str, Any], choice: QueueChoice, allowed_flavors: tuple[Flavor, ...], message: str
) -> None:
    denied(rule_quota(wl(obj), choice, allowed_flavors, POLICY), 403, message)


def test_borrowing_limit_is_named_when_it_is_the_cap() -> None:
    policy = policy_from_objects(
        [
            flavor_obj("h", {labels.GFD_PRODUCT: H100}),
            cq_obj("mine", {"h": {GPU: (8, 4)}}, cohort="c"),
            cq_obj("other", {"h": {GPU: (100,)}}, cohort="c"),
            lq_obj("team", "q", "mine"),
        ]
    )
    local, cluster = policy.local_queue("team", "q"), policy.cluster_queue("mine")
    assert local is not None
    assert cluster is not None
    flavor = policy.flavor("h")
    assert flavor is not None
    result = rule_quota(
        wl(job(parallelism=13, gpus=1)), QueueChoice(local, cluster), [flavor], policy
    )
    denied(
        result, 403, "at most 12 GPUs in flavor h", "nominal 8 + borrowable 4 (its borrowingLimit)"
    )


# ---------------------------------------------------------------- rule 6: gang


def _gang(obj: dict[str, Any], uid: str = "uid-1") -> tuple[Any, Any]:
    """The gang rule's denial, or ``()`` and the object with the gang id of a request
    ``uid`` written where the rule left room for it (``name_gang``, the last step)."""
    out = Draft(obj)
    workload = wl(obj)
    slots = rule_gang(workload, queue(), ALL_GPU, POLICY, out)
    if isinstance(slots, Denied):
        return slots, out.root
    gid = gang_id(workload.namespace, workload.name, workload.generate_name, uid)
    return (), name_gang(Allowed(out.root, gang_slots=slots), gid).object


@pytest.mark.parametrize(
    ("obj", "gang", "size", "minimum"),
    [
        pytest.param(job(parallelism=4), "team.train", "4", "4", id="job-all-pods"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "2"}), "team.train", "4",
                     "2", id="job-gang-min"),
        pytest.param(job(parallelism=4, template_meta={"labels": {labels.GANG: "mine"}}), "mine",
                     "4", "4", id="existing-gang-label-kept"),
        pytest.param(job(parallelism=4, extra_labels={labels.GANG: "set-on-job"}), "set-on-job",
                     "4", "4", id="gang-label-on-the-job"),
        pytest.param(job(parallelism=2, template_meta={"annotations": {labels.GANG_MIN: "1"}}),
                     "team.train", "2", "1", id="gang-min-on-template"),
    ],
)  # fmt: skip
def test_rule_gang_writes_gang_metadata_on_templates(
    obj: dict[str, Any], gang: str, size: str, minimum: str
) -> None:
    result, out = _gang(obj)
    assert result == ()
    meta = out["spec"]["template"]["metadata"]
    assert meta["labels"][labels.GANG] == gang
    assert meta["annotations"][labels.GANG_SIZE] == size
    assert meta["annotations"][labels.GANG_MIN] == minimum


def test_rule_gang_counts_every_member_of_a_jobset() -> None:
    result, out = _gang(jobset([("workers", 2, 2, 4), ("driver", 1, 1, None)]))
    assert result == ()
    for rjob in out["spec"]["replicatedJobs"]:
        meta = rjob["template"]["spec"]["template"]["metadata"]
        assert meta["labels"] == {labels.GANG: "team.pretrain"}
        assert meta["annotations"] == {labels.GANG_SIZE: "5", labels.GANG_MIN: "5"}


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(job(parallelism=1), id="single-pod-job"),
        pytest.param(job(parallelism=None), id="parallelism-defaults-to-one"),
        pytest.param(pod(), id="pod"),
    ],
)
def test_rule_gang_leaves_single_pods_alone(obj: dict[str, Any]) -> None:
    result, out = _gang(obj)
    assert result == ()
    assert out == obj


@pytest.mark.parametrize(
    ("obj", "code", "fragments"),
    [
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "0"}), 422,
                     ["annotation tessera.dev/gang-min='0' must be a whole number from 1 to the "
                      "4 pods of job train"], id="zero"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "5"}), 422,
                     ["from 1 to the 4 pods"], id="more-than-size"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "two"}), 422,
                     ["'two' must be a whole number"], id="not-a-number"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "\N{SUPERSCRIPT TWO}"}),
                     422, ["must be a whole number"], id="a-digit-int-refuses"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "2" * 5000}), 422,
                     ["must be a whole number from 1 to the 4 pods"],
                     id="more-digits-than-int-reads"),
        pytest.param(pod(annotations={labels.GANG_MIN: "2"}), 422,
                     ["from 1 to the 1 pod of pod notebook"], id="pod-alone"),
        pytest.param(job(parallelism=8, gpus=8, annotations={labels.GANG_MIN: "4"}), 403,
                     ["tessera.dev/gang-min=4: the 4 pods that must run together need at least "
                      "32 GPUs", "at most 24 GPUs in flavor h100-reserved",
                      "lower tessera.dev/gang-min or ask for fewer GPUs per pod"],
                     id="gang-min-over-quota"),
        pytest.param(job(parallelism=4, template_meta={"annotations": {labels.GANG_SIZE: "3"}}),
                     422, ["pod template /spec/template has annotation tessera.dev/gang-size='3', "
                           "but job train makes 4 pods"], id="wrong-gang-size"),
        pytest.param(job(parallelism=4, annotations={labels.GANG_MIN: "2"},
                         template_meta={"annotations": {labels.GANG_MIN: "3"}}),
                     422, ["set tessera.dev/gang-min once, on the job"], id="two-gang-mins"),
    ],
)  # fmt: skip
def test_rule_gang_denies(obj: dict[str, Any], code: int, fragments: list[str]) -> None:
    denied(_gang(obj)[0], code, *fragments)


def test_generated_names_get_a_stable_unique_gang_id() -> None:
    first = gang_id("team", "", "finetune-", "dafa562b-c506-4524-bf29-6a78766e5406")
    assert first == gang_id("team", "", "finetune-", "dafa562b-c506-4524-bf29-6a78766e5406")
    assert first != gang_id("team", "", "finetune-", "38c7ba84-b85b-47ce-b216-97656af8e5b4")
    assert first.startswith("team.finetune-")
    assert len(first) == len("team.finetune-") + 5
    assert set(first[-5:]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert gang_id("team", "named", "ignored-", "uid") == "team.named"


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("n" * 63, "j" * 63), ("team", "a" * 58 + "-" + "b" * 10), ("x", "y." * 40)],
)
def test_long_gang_ids_are_valid_label_values(namespace: str, name: str) -> None:
    gid = gang_id(namespace, name, "", "uid")
    assert len(gid) <= 63
    assert gid[0].isalnum()
    assert gid[-1].isalnum()
    assert gid != gang_id(namespace, name + "z", "", "uid")


def test_reinvocation_keeps_the_gang_id_even_with_another_uid() -> None:
    obj = job(name=None, generate_name="finetune-", parallelism=2)
    first, out = _gang(obj, uid="first")
    assert first == ()
    second, again = _gang(out, uid="second")
    assert second == ()
    assert again == out


# ---------------------------------------------------------------- rule 7: topology


def _topology(
    obj: dict[str, Any], allowed: tuple[Flavor, ...] = ALL_GPU
) -> tuple[Any, dict[str, Any]]:
    out = Draft(obj)
    return rule_topology(wl(obj), queue(), allowed, POLICY, out), out.root


@pytest.mark.parametrize(
    ("value", "allowed", "warns"),
    [
        pytest.param("required:rack", flavors("h100-reserved"), False, id="short-name"),
        pytest.param("preferred:example.com/block", ALL_GPU, False, id="full-label-preferred"),
        pytest.param("required:hostname", ALL_GPU, True, id="required-some-flavors-lack-it"),
        pytest.param(" required:rack ", flavors("h100-spot"), False, id="spaces"),
    ],
)  # fmt: skip
def test_rule_topology_copies_a_known_level_onto_templates(
    value: str, allowed: tuple[Flavor, ...], warns: bool
) -> None:
    obj = jobset([("w", 2, 2, 4), ("d", 1, 1, None)], annotations={labels.TOPOLOGY: value})
    result, out = _topology(obj, allowed)
    assert isinstance(result, tuple)
    assert bool(result) is warns
    if warns:
        assert result[0].startswith("flavors a100 have no topology level 'hostname'")
    for rjob in out["spec"]["replicatedJobs"]:
        assert rjob["template"]["spec"]["template"]["metadata"]["annotations"] == {
            labels.TOPOLOGY: value
        }


def test_a_template_keeps_its_own_topology() -> None:
    obj = job(annotations={labels.TOPOLOGY: "preferred:block"},
              template_meta={"annotations": {labels.TOPOLOGY: "required:rack"}})  # fmt: skip
    result, out = _topology(obj, flavors("h100-reserved", "h100-spot"))
    assert result == ()
    assert out["spec"]["template"]["metadata"] == obj["spec"]["template"]["metadata"]
    # the template's required rack, not the job's preferred block, is what the gang follows
    assert _gang_terms(out["spec"]["template"]) == [RACK_TERM]


# ---------------------------------------------------------------- rule 7: the gang's pod affinity

RACK_TERM = {"labelSelector": {}, "matchLabelKeys": [labels.GANG],
             "topologyKey": "example.com/rack"}  # fmt: skip
"""What a member of a ``required:rack`` gang is told: stay in the rack of its gang's pods
(kube-apiserver adds ``tessera.dev/gang In (<id>)`` to the selector at pod creation)."""
BLOCK_TERM = {**RACK_TERM, "topologyKey": "example.com/block"}
HOST_TERM = {**RACK_TERM, "topologyKey": labels.HOSTNAME}
USER_TERM = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
DISAGREEING = policy_from_objects(
    [
        topology_obj("gpu", ["example.com/block", "example.com/rack", labels.HOSTNAME]),
        topology_obj("dc2", ["dc2.example.com/block", "dc2.example.com/rack"]),
        flavor_obj("h100-dc1", {labels.GFD_PRODUCT: H100}, tessera_topology="gpu"),
        flavor_obj("h100-dc2", {labels.GFD_PRODUCT: H100}, tessera_topology="dc2"),
        flavor_obj("h100-ghost", {labels.GFD_PRODUCT: H100}, tessera_topology="missing"),
    ]
)


def _gang_terms(template: Mapping[str, Any]) -> Any:
    return at(template, "spec", "affinity", "podAffinity",
              "requiredDuringSchedulingIgnoredDuringExecution")  # fmt: skip


def _templates(obj: Mapping[str, Any]) -> list[Any]:
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in obj["spec"]["replicatedJobs"]]
    if obj["kind"] == "Pod":
        return [obj]
    return [obj["spec"]["template"]]


@pytest.mark.parametrize(
    ("obj", "allowed", "terms"),
    [
        pytest.param(job(annotations={labels.TOPOLOGY: "required:rack"}),
                     flavors("h100-reserved", "h100-spot"), [[RACK_TERM]], id="required-rack"),
        pytest.param(job(annotations={labels.TOPOLOGY: "required:example.com/block"}),
                     flavors("h100-reserved"), [[BLOCK_TERM]], id="full-label"),
        pytest.param(job(annotations={labels.TOPOLOGY: "required:hostname"}), ALL_GPU,
                     [[HOST_TERM]], id="a-flavor-without-topology-does-not-count"),
        pytest.param(job(template_meta={"annotations": {labels.TOPOLOGY: "required:rack"}}),
                     flavors("h100-reserved"), [[RACK_TERM]], id="template-own"),
        pytest.param(jobset([("w", 2, 2, 4), ("ps", 1, 1, 8)],
                            annotations={labels.TOPOLOGY: "required:rack"}),
                     flavors("h100-reserved"), [[RACK_TERM], [RACK_TERM]],
                     id="jobset-every-template"),
        pytest.param(job(annotations={labels.TOPOLOGY: "preferred:rack"}),
                     flavors("h100-reserved"), [None], id="preferred-nothing"),
        pytest.param(job(annotations={labels.TOPOLOGY: "required:rack"}), flavors("h100-tas"),
                     [None], id="mode-b-nothing"),
        pytest.param(job(annotations={labels.TOPOLOGY: "required:rack"}),
                     flavors("h100-reserved", "h100-tas"), [None], id="some-mode-b-nothing"),
        pytest.param(job(parallelism=1, annotations={labels.TOPOLOGY: "required:rack"}),
                     flavors("h100-reserved"), [None], id="one-pod-job-nothing"),
        pytest.param(pod(annotations={labels.TOPOLOGY: "required:hostname"}),
                     flavors("h100-reserved"), [None], id="pod-nothing"),
        pytest.param(jobset([("w", 2, 2, 4), ("d", 1, 1, None)],
                            annotations={labels.TOPOLOGY: "required:rack"}),
                     flavors("h100-reserved"), [None, None], id="cpu-member-nothing"),
    ],
)  # fmt: skip
def test_a_gang_with_a_required_level_is_told_to_stay_with_itself(
    obj: dict[str, Any], allowed: tuple[Flavor, ...], terms: list[Any]
) -> None:
    result, out = _topology(obj, allowed)
    assert isinstance(result, tuple)
    assert [_gang_terms(t) for t in _templates(out)] == terms


@pytest.mark.parametrize(
    ("allowed", "terms"),
    [
        pytest.param(("h100-dc1",), [RACK_TERM], id="one-topology"),
        pytest.param(("h100-dc1", "h100-dc2"), None, id="labels-differ"),
        pytest.param(("h100-dc1", "h100-ghost"), None, id="a-topology-missing"),
    ],
)
def test_the_gang_term_needs_every_flavors_topology_to_agree_on_the_label(
    allowed: tuple[str, ...], terms: Any
) -> None:
    obj = job(annotations={labels.TOPOLOGY: "required:rack"})
    chosen = tuple(DISAGREEING.flavor(n) for n in allowed)
    assert all(chosen)
    out = Draft(obj)
    result = rule_topology(wl(obj), queue(), chosen, DISAGREEING, out)  # type: ignore[arg-type]
    assert isinstance(result, tuple)
    assert _gang_terms(out.root["spec"]["template"]) == terms


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        pytest.param([USER_TERM], [USER_TERM, RACK_TERM], id="the-users-kept-ours-appended"),
        pytest.param([RACK_TERM], [RACK_TERM], id="the-users-is-ours"),
        pytest.param([USER_TERM, RACK_TERM], [USER_TERM, RACK_TERM], id="among-the-users"),
        pytest.param([], [RACK_TERM], id="empty-list"),
    ],
)
def test_the_users_pod_affinity_terms_are_kept_and_ours_not_repeated(
    written: list[Any], expected: list[Any]
) -> None:
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": written}}
    obj = job(annotations={labels.TOPOLOGY: "required:rack"}, affinity=affinity)
    _, out = _topology(obj, flavors("h100-reserved"))
    assert _gang_terms(out["spec"]["template"]) == expected
    assert obj["spec"]["template"]["spec"]["affinity"] == affinity  # the input is not changed


def test_the_gang_term_is_written_once_however_often_the_webhook_is_called() -> None:
    obj = job(name=None, generate_name="finetune-", annotations={labels.TOPOLOGY: "required:rack"},
              affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                        [USER_TERM]}})  # fmt: skip
    first = admit(request(obj), POLICY, CONFIG)
    assert isinstance(first, Allowed)
    template = first.object["spec"]["template"]
    assert _gang_terms(template) == [USER_TERM, RACK_TERM]
    # the node affinity of the flavors sits beside it, in the same affinity
    assert at(template, "spec", "affinity", "nodeAffinity") is not None
    again = admit(request(first.object, uid="another-uid"), POLICY, CONFIG)
    assert isinstance(again, Allowed)
    assert diff(first.object, again.object) == []


def test_two_jobs_that_differ_in_name_get_the_same_term() -> None:
    terms = []
    for name in ("train-a", "train-b"):
        decision = admit(request(job(name=name, annotations={labels.TOPOLOGY: "required:rack"})),
                         POLICY, CONFIG)  # fmt: skip
        assert isinstance(decision, Allowed)
        template = decision.object["spec"]["template"]
        assert template["metadata"]["labels"][labels.GANG] == f"team.{name}"
        terms.append(_gang_terms(template))
    assert terms[0] == terms[1] == [RACK_TERM]


def test_pod_affinity_terms_that_are_not_a_list_are_invalid() -> None:
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"a": 1}}}
    obj = job(annotations={labels.TOPOLOGY: "required:rack"}, affinity=affinity)
    denied(admit(request(obj), POLICY, CONFIG), 422,
           "/spec/template/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution"
           " is not a list")  # fmt: skip


@pytest.mark.parametrize(
    ("value", "key", "node_label"),
    [
        pytest.param("required:rack", labels.KUEUE_REQUIRED_TOPOLOGY, "example.com/rack",
                     id="required"),
        pytest.param("preferred:block", labels.KUEUE_PREFERRED_TOPOLOGY, "example.com/block",
                     id="preferred"),
        pytest.param("required:kubernetes.io/hostname", labels.KUEUE_REQUIRED_TOPOLOGY,
                     labels.HOSTNAME, id="full-label"),
    ],
)  # fmt: skip
def test_with_kueues_topology_the_level_goes_to_kueue_and_not_to_the_extender(
    value: str, key: str, node_label: str
) -> None:
    obj = jobset([("w", 2, 2, 4), ("d", 1, 1, None)], annotations={labels.TOPOLOGY: value})
    result, out = _topology(obj, flavors("h100-tas"))
    assert isinstance(result, tuple)
    assert result == (
        f"topology {value}: Kueue's topology-aware scheduling places the pods ({key})",
    )
    for rjob in out["spec"]["replicatedJobs"]:
        assert rjob["template"]["spec"]["template"]["metadata"]["annotations"] == {key: node_label}


def test_with_some_flavors_kueues_kueue_gets_the_level_and_the_others_are_named() -> None:
    obj = job(annotations={labels.TOPOLOGY: "required:rack"})
    result, out = _topology(obj, flavors("h100-reserved", "h100-tas"))
    assert isinstance(result, tuple)
    assert result[1] == (
        "flavors h100-reserved have no spec.topologyName: Kueue admits a job that asks for a "
        "topology only to flavors that have one"
    )
    assert out["spec"]["template"]["metadata"]["annotations"] == {
        labels.KUEUE_REQUIRED_TOPOLOGY: "example.com/rack"
    }


def test_kueues_own_annotation_written_by_the_user_is_kept() -> None:
    own = {labels.KUEUE_REQUIRED_TOPOLOGY: "example.com/block"}
    obj = job(annotations={labels.TOPOLOGY: "required:rack"}, template_meta={"annotations": own})
    _, out = _topology(obj, flavors("h100-tas"))
    assert out["spec"]["template"]["metadata"]["annotations"] == {
        labels.KUEUE_REQUIRED_TOPOLOGY: "example.com/block"
    }


@pytest.mark.parametrize(
    ("obj", "allowed", "code", "fragments"),
    [
        pytest.param(job(annotations={labels.TOPOLOGY: "required:zone"}), ALL_GPU, 403,
                     ["annotation tessera.dev/topology='required:zone' on job train: 'zone' is not "
                      "a level of the allowed flavors' topology (Topology gpu: block, rack, "
                      "hostname)"], id="unknown-level"),
        pytest.param(job(annotations={labels.TOPOLOGY: "rack"}), ALL_GPU, 422,
                     ["'rack' is not required:<level> or preferred:<level>"], id="no-mode"),
        pytest.param(job(annotations={labels.TOPOLOGY: "always:rack"}), ALL_GPU, 422,
                     ["is not required:<level>"], id="bad-mode"),
        pytest.param(job(annotations={labels.TOPOLOGY: "required:rack"}), flavors("a100"), 403,
                     ["the flavors queue research (ClusterQueue research) allows (a100) have no "
                      "Topology"], id="flavors-without-topology"),
        pytest.param(pod(annotations={labels.TOPOLOGY: "preferred:zone"}), ALL_GPU, 403,
                     ["on pod notebook: 'zone' is not a level"], id="pod"),
        pytest.param(job(template_meta={"annotations": {labels.TOPOLOGY: "required:row"}}),
                     ALL_GPU, 403, ["on pod template /spec/template: 'row' is not a level"],
                     id="template-level-checked-too"),
    ],
)  # fmt: skip
def test_rule_topology_denies(
    obj: dict[str, Any], allowed: tuple[Flavor, ...], code: int, fragments: list[str]
) -> None:
    denied(_topology(obj, allowed)[0], code, *fragments)


# ---------------------------------------------------------------- rule 8: time limit


@pytest.mark.parametrize(
    ("obj", "choice", "paths", "seconds", "warns"),
    [
        pytest.param(job(), queue(), [("spec",), ("spec", "template", "spec")], 14400, True,
                     id="job-default"),
        pytest.param(job(spec={"activeDeadlineSeconds": 600}), queue(),
                     [("spec",), ("spec", "template", "spec")], 600, False, id="job-own-kept"),
        pytest.param(job(spec={"activeDeadlineSeconds": 86400}), queue(), [("spec",)], 86400,
                     False, id="exactly-the-maximum"),
        pytest.param(pod(), queue(), [("spec",)], 14400, True, id="pod-default"),
        pytest.param(jobset([("w", 1, 2, 4), ("d", 1, 1, None)]), queue(),
                     [("spec", "replicatedJobs", 0, "template", "spec"),
                      ("spec", "replicatedJobs", 1, "template", "spec"),
                      ("spec", "replicatedJobs", 1, "template", "spec", "template", "spec")],
                     14400, True, id="jobset-each-replicated-job"),
        pytest.param(job(queue="vision"), queue("vision"), [("spec",)], None, False,
                     id="no-default-no-maximum"),
    ],
)  # fmt: skip
def test_rule_time_limit_defaults(
    obj: dict[str, Any],
    choice: QueueChoice,
    paths: list[tuple[str | int, ...]],
    seconds: int | None,
    warns: bool,
) -> None:
    out = Draft(obj)
    result = rule_time_limit(wl(obj), choice, out)
    assert isinstance(result, tuple)
    for path in paths:
        assert at(out.root, *path, "activeDeadlineSeconds") == seconds
    if warns:
        assert result == (
            "activeDeadlineSeconds set to 14400 (4h), the default time limit of queue research",
        )
    else:
        assert result == ()


def test_the_maximum_is_the_default_when_there_is_no_default() -> None:
    policy = policy_from_objects(
        [cq_obj("cq", {"f": {GPU: (8,)}}), lq_obj("team", "q", "cq", {labels.MAX_TIME_LIMIT: "2h"})]
    )
    local, cluster = policy.local_queue("team", "q"), policy.cluster_queue("cq")
    assert local is not None
    assert cluster is not None
    out = Draft(job())
    rule_time_limit(wl(job()), QueueChoice(local, cluster), out)
    assert out.root["spec"]["activeDeadlineSeconds"] == 7200


@pytest.mark.parametrize(
    ("obj", "fragments"),
    [
        pytest.param(job(spec={"activeDeadlineSeconds": 172800}),
                     ["job asks for activeDeadlineSeconds 172800 (48h); queue research "
                      "(ClusterQueue research) allows at most 86400 (24h, "
                      "tessera.dev/max-time-limit); set a shorter activeDeadlineSeconds or use "
                      "another queue"], id="job"),
        pytest.param(pod(activeDeadlineSeconds=90000), ["pod asks for activeDeadlineSeconds 90000"],
                     id="pod"),
        pytest.param(job(activeDeadlineSeconds=90000),
                     ["pod template /spec/template asks for activeDeadlineSeconds 90000"],
                     id="job-template"),
        pytest.param(jobset([("w", 1, 1, 4)], job_spec={"activeDeadlineSeconds": 90000}),
                     ["replicated job w asks for activeDeadlineSeconds 90000 (25h)"], id="jobset"),
    ],
)  # fmt: skip
def test_rule_time_limit_denies_above_the_maximum(
    obj: dict[str, Any], fragments: list[str]
) -> None:
    denied(rule_time_limit(wl(obj), queue(), Draft(obj)), 403, *fragments)


# ---------------------------------------------------------------- rule 9: scheduler


@pytest.mark.parametrize(
    ("obj", "config", "expected"),
    [
        pytest.param(job(), CONFIG, "tessera-gpu", id="absent"),
        pytest.param(job(schedulerName="default-scheduler"), CONFIG, "tessera-gpu",
                     id="apiserver-default-replaced"),
        pytest.param(job(schedulerName="my-scheduler"), CONFIG, "my-scheduler", id="user-choice"),
        pytest.param(job(), AdmitConfig(scheduler_name="gpu-profile"), "gpu-profile",
                     id="configured-profile"),
    ],
)  # fmt: skip
def test_rule_scheduler(obj: dict[str, Any], config: AdmitConfig, expected: str) -> None:
    out = Draft(obj)
    assert rule_scheduler(wl(obj), config, out) == ()
    assert out.root["spec"]["template"]["spec"]["schedulerName"] == expected


def test_rule_scheduler_sets_every_template_of_a_jobset_and_the_pod_itself() -> None:
    obj = jobset([("w", 1, 2, 4), ("d", 1, 1, None)])
    out = Draft(obj)
    rule_scheduler(wl(obj), CONFIG, out)
    names = [at(r, "template", "spec", "template", "spec", "schedulerName")
             for r in out.root["spec"]["replicatedJobs"]]  # fmt: skip
    assert names == ["tessera-gpu"] * 2
    out = Draft(pod())
    rule_scheduler(wl(pod()), CONFIG, out)
    assert out.root["spec"]["schedulerName"] == "tessera-gpu"


# ---------------------------------------------------------------- UPDATE


def _with(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = clone(obj)
    node: Any = out
    for token in path[:-1]:
        node = node[int(token)] if isinstance(node, list) else node.setdefault(token, {})
    node[path[-1]] = value
    return out


QUEUE_LABEL = ("metadata", "labels", labels.QUEUE_NAME)
INDICES = ("metadata", "annotations", labels.GPU_INDICES)
SUSPENDED = job(spec={"suspend": True})
RUNNING = job(spec={"suspend": False})
GANGED = job(
    spec={"suspend": False},
    template_meta={"labels": {labels.GANG: "team.train"},
                   "annotations": {labels.GANG_SIZE: "2", labels.GANG_MIN: "2"}},
)  # fmt: skip
BOUND = pod(annotations={labels.GPU_INDICES: "3"})
"""A pod the extender bound to GPU 3 (the Binding wrote the annotation)."""


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(SUSPENDED, _with(SUSPENDED, QUEUE_LABEL, "vision"),
                     id="queue-change-while-suspended"),
        pytest.param(SUSPENDED, _with(SUSPENDED, ("spec", "suspend"), False),
                     id="kueue-unsuspends"),
        pytest.param(RUNNING, _with(RUNNING, ("metadata", "labels", "team"), "x"),
                     id="other-label"),
        pytest.param(GANGED, _with(GANGED, ("spec", "suspend"), True), id="gang-unchanged"),
        pytest.param(BOUND, _with(BOUND, ("metadata", "labels", "team"), "x"),
                     id="bound-pod-relabelled"),
    ],
)  # fmt: skip
def test_updates_allowed(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert check_update(wl(new), wl(old)) is None


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        pytest.param(RUNNING, _with(RUNNING, ("metadata", "labels", labels.QUEUE_NAME), "vision"),
                     "label kueue.x-k8s.io/queue-name cannot change from 'research' to 'vision' "
                     "while job train is admitted or running", id="queue-change-while-running"),
        pytest.param(SUSPENDED, _with(_with(SUSPENDED, ("spec", "suspend"), False),
                                      ("metadata", "labels", labels.QUEUE_NAME), "vision"),
                     "cannot change from 'research' to 'vision'", id="unsuspend-and-move"),
        pytest.param(pod(), _with(pod(), ("metadata", "labels", labels.QUEUE_NAME), "vision"),
                     "while pod notebook is admitted", id="pod-without-gate"),
        pytest.param(GANGED, _with(GANGED, ("metadata", "annotations"), {labels.GANG_MIN: "1"}),
                     "annotation tessera.dev/gang-min cannot change after creation (was unset, "
                     "now '1')", id="gang-min-added"),
        pytest.param(GANGED, _with(GANGED, ("spec", "template", "metadata", "labels", labels.GANG),
                                   "other"),
                     "label tessera.dev/gang of pod template /spec/template cannot change",
                     id="gang-label"),
        pytest.param(GANGED, _with(GANGED, ("spec", "template", "metadata", "annotations",
                                            labels.GANG_SIZE), "3"),
                     "annotation tessera.dev/gang-size of pod template", id="gang-size"),
        # issue 20: an editor who rewrites the record would free the GPUs the pod holds
        pytest.param(BOUND, _with(BOUND, INDICES, "5"),
                     "annotation tessera.dev/gpu-indices cannot change (was '3', now '5'): it "
                     "records the GPUs the extender gave pod notebook", id="gpu-indices-rewritten"),
        pytest.param(pod(), _with(pod(), INDICES, "0"),
                     "annotation tessera.dev/gpu-indices cannot change (was unset, now '0')",
                     id="gpu-indices-added"),
        pytest.param(BOUND, pod(), "was '3', now unset", id="gpu-indices-removed"),
    ],
)  # fmt: skip
def test_updates_denied(old: dict[str, Any], new: dict[str, Any], fragment: str) -> None:
    denied(check_update(wl(new), wl(old)), 422, fragment)


# ---------------------------------------------------------------- admit


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        pytest.param(request(job(gpus=None)), "no-gpu", id="no-gpu"),
        pytest.param(request(job(queue=None, namespace="free")), "no-queue", id="unmanaged"),
        pytest.param(request(job(), operation="DELETE"), "not-mutated", id="delete"),
        pytest.param(request(job(), operation="UPDATE", old=job()), "validated", id="update"),
        pytest.param(
            ReviewRequest(uid="u", kind=GroupVersionKind("apps", "v1", "Deployment"),
                          resource=GroupVersionResource("apps", "v1", "deployments"),
                          operation="CREATE", object={"kind": "Deployment"}),
            "not-a-workload", id="other-kind"),
    ],
)  # fmt: skip
def test_admit_lets_through_what_is_not_its_business_untouched(
    req: ReviewRequest, reason: str
) -> None:
    decision = admit(req, POLICY, CONFIG)
    assert isinstance(decision, Allowed)
    assert decision.reason == reason
    assert decision.object == req.object


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        pytest.param(job(parallelism=-1), "spec.parallelism must be a whole number",
                     id="parallelism"),
        pytest.param(job(gpus=None, milli=1500), "tessera.dev/gpu-milli is 1500",
                     id="share-too-big"),
        pytest.param(job(spec={"activeDeadlineSeconds": "1h"}), "activeDeadlineSeconds must be",
                     id="deadline"),
        pytest.param(jobset([]), "spec.replicatedJobs is empty", id="empty-jobset"),
        pytest.param(_with(pod(), ("metadata", "labels"), ["a"]),
                     "metadata.labels is not an object",
                     id="labels"),
    ],
)  # fmt: skip
def test_admit_rejects_malformed_objects_as_invalid(obj: dict[str, Any], fragment: str) -> None:
    denied(admit(request(obj), POLICY, CONFIG), 422, fragment)


def test_admit_mutates_a_job_with_every_rule_and_is_idempotent() -> None:
    obj = job(name=None, generate_name="finetune-", annotations={labels.TOPOLOGY: "preferred:rack"})
    decision = admit(request(obj), POLICY, CONFIG)
    assert isinstance(decision, Allowed)
    out = decision.object
    template = out["spec"]["template"]
    assert out["spec"]["suspend"] is True
    assert out["metadata"]["labels"][labels.PRIORITY_CLASS] == "low"
    assert template["metadata"]["labels"][labels.GANG].startswith("team.finetune-")
    assert template["metadata"]["annotations"][labels.TOPOLOGY] == "preferred:rack"
    assert template["spec"]["schedulerName"] == "tessera-gpu"
    assert out["spec"]["activeDeadlineSeconds"] == 14400
    assert decision.queue == "research"
    assert len(decision.warnings) == 3
    again = admit(request(out, uid="another-uid"), POLICY, CONFIG)
    assert isinstance(again, Allowed)
    assert diff(out, again.object) == []
    assert obj == job(
        name=None, generate_name="finetune-", annotations={labels.TOPOLOGY: "preferred:rack"}
    )


def test_admit_defaults_the_queue_and_says_so() -> None:
    decision = admit(
        request(pod(namespace="lab", queue=None, gpus=None, milli=250)), POLICY, CONFIG
    )
    assert isinstance(decision, Allowed)
    assert decision.object["metadata"]["labels"][labels.QUEUE_NAME] == "sandbox"
    assert decision.warnings[0] == (
        "no kueue.x-k8s.io/queue-name label: sent to sandbox, the default queue of namespace lab"
    )


@given(
    parallelism=st.integers(0, 6),
    gpus=st.integers(1, 8),
    gang_min=st.none() | st.integers(0, 7).map(str),
    product=st.none() | st.sampled_from(["H100", "A100", "B200"]),
)
@settings(max_examples=60, deadline=None)
def test_the_first_denial_wins_and_nothing_raises(
    parallelism: int, gpus: int, gang_min: str | None, product: str | None
) -> None:
    annotations = {}
    if gang_min is not None:
        annotations[labels.GANG_MIN] = gang_min
    if product is not None:
        annotations[labels.GPU_PRODUCT] = product
    decision = admit(
        request(job(parallelism=parallelism, gpus=gpus, annotations=annotations)), POLICY, CONFIG
    )
    if isinstance(decision, Denied):
        assert decision.code in (403, 422)
        assert decision.message


def test_whole_gpus_and_shares_must_fit_one_flavor() -> None:
    policy = policy_from_objects(
        [
            flavor_obj("big", {labels.GFD_PRODUCT: H100}),
            flavor_obj("shared", {labels.GFD_PRODUCT: A100}),
            cq_obj(
                "mine", {"big": {GPU: (16,), MILLI: (0,)}, "shared": {GPU: (0,), MILLI: (8000,)}}
            ),
            lq_obj("team", "q", "mine"),
        ]
    )
    local, cluster = policy.local_queue("team", "q"), policy.cluster_queue("mine")
    assert local is not None
    assert cluster is not None
    mixed = wl(jobset([("train", 1, 2, 4)]))
    share = wl(pod(gpus=None, milli=500))
    mixed = replace(mixed, templates=mixed.templates + share.templates)
    found = tuple(f for f in (policy.flavor("big"), policy.flavor("shared")) if f)
    denied(
        rule_quota(mixed, QueueChoice(local, cluster), found, policy),
        403,
        f"asks for 500 milli-GPUs (1 pod {X} 500); queue q (ClusterQueue mine) can get at most "
        "0 milli-GPUs in flavor big",
    )


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        # issue 20: a pod that names another team's gang would hold that gang to its rack;
        # refused also where no queue rule runs (a namespace without queues)
        pytest.param(pod(namespace="free", queue=None, extra_labels={labels.GANG: "team.train"}),
                     "label tessera.dev/gang='team.train' names a gang outside namespace free",
                     id="pod-in-an-unmanaged-namespace"),
        pytest.param(job(template_meta={"labels": {labels.GANG: "other.train"}}),
                     "label tessera.dev/gang='other.train' of pod template /spec/template names "
                     "a gang outside namespace team", id="job-template"),
        pytest.param(job(extra_labels={labels.GANG: "teamx.train"}),
                     "names a gang outside namespace team", id="a-prefix-is-not-the-namespace"),
    ],
)  # fmt: skip
def test_a_gang_label_of_another_namespace_is_refused(obj: dict[str, Any], fragment: str) -> None:
    denied(admit(request(obj), POLICY, CONFIG), 422, fragment)
    update = request(obj, operation="UPDATE", old=obj)
    denied(admit(update, POLICY, CONFIG), 422, fragment)
