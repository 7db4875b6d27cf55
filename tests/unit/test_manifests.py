"""The install YAML in ``manifests/`` says what Tessera's code means, and grants no more.

What an admin would otherwise find out on a cluster: a key spelled differently from
``cluster/labels.py`` (the webhook would write one thing and the extender read another), a
webhook configuration that calls the webhook for the wrong objects or fails open, RBAC
wider than each server needs, a scheduler configuration whose extender block does not
match the sidecar, a container that runs as root or writes to its image, or a file that
``kubectl apply -k`` silently leaves out. These are static checks of the YAML; the e2e
suite applies the same files to a real kube-apiserver.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.manifests import set_ca_bundle
from certs.plan import make_plan
from cluster import labels
from cluster.convert.grammar import parse_topology_levels
from extender.__main__ import parse_settings
from extender.settings import ExtenderSettings
from loadtest.schedperf.workload import LEVELS
from loadtest.stack import install
from server.deadline import parse_go_duration
from webhook.owners import JOB_CONTROLLER_USERNAMES, JOBSET_CONTROLLER_USERNAMES
from webhook.settings import MAX_TIMEOUT_S, WebhookSettings

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
NAMESPACE = "tessera-system"
SCHEDULER_SA = "tessera-scheduler"

CONSTANTS = frozenset(
    value for name, value in vars(labels).items() if name.isupper() and isinstance(value, str)
)
"""Every key and name in cluster/labels.py."""

# A key of one of Tessera's domains: not part of a longer domain, ending in a name character.
OUR_KEY = re.compile(
    r"(?<![\w.-])(?:tessera\.dev|kueue\.x-k8s\.io|nvidia\.com)/[A-Za-z0-9._-]*[A-Za-z0-9]"
)


@dataclass(frozen=True, slots=True)
class Doc:
    path: Path
    obj: dict[str, Any]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(MANIFESTS))

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.obj.get("metadata", {}).get("name", ""))


def yaml_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs() -> list[Doc]:
    return [
        Doc(path, obj)
        for path in yaml_files()
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if isinstance(obj, dict)
    ]


DOCS = load_docs()
INSTALL = [d for d in DOCS if d.path.parent == MANIFESTS and d.path.name != "kustomization.yaml"]
"""What `kubectl apply -k manifests/` applies."""


def one(kind: str, name: str, docs: list[Doc] = INSTALL) -> dict[str, Any]:
    found = [d.obj for d in docs if d.kind == kind and d.name == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def strings(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key it sits under, string) for every mapping key and string value below ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield "", str(k)
            yield from strings(v, str(k))
    elif isinstance(node, list):
        for item in node:
            yield from strings(item, key)
    elif isinstance(node, str):
        yield key, node


def scheduler_config() -> dict[str, Any]:
    config_map = one("ConfigMap", "tessera-scheduler-config")
    loaded: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return loaded


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(deployment)
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in containers(deployment) if c["name"] == name]
    return found


def flag_values(args: list[str], flag: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]


# ---------------------------------------------------------------- keys and names


def test_the_manifests_exist_and_parse() -> None:
    assert INSTALL, "manifests/ holds no objects"
    assert {d.kind for d in INSTALL} >= {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "Deployment",
        "Service",
        "MutatingWebhookConfiguration",
        "ConfigMap",
        "PodDisruptionBudget",
    }


def test_every_tessera_kueue_and_nvidia_key_is_a_constant_of_cluster_labels() -> None:
    """Labels, annotations, resources, and the keys inside CEL and the scheduler config."""
    strays = sorted(
        {
            f"{doc.where}: {match}"
            for doc in DOCS
            for key, text in strings(doc.obj)
            if key != "apiVersion"
            for match in OUR_KEY.findall(text)
            if match not in CONSTANTS
        }
    )
    assert not strays, "not in cluster/labels.py:\n" + "\n".join(strays)


def test_the_keys_the_servers_share_are_spelled_from_cluster_labels() -> None:
    """The scan above only catches strays: make sure the keys are actually there."""
    used = {
        match
        for doc in DOCS
        for key, text in strings(doc.obj)
        if key != "apiVersion"
        for match in OUR_KEY.findall(text)
    }
    assert {
        labels.QUEUE_NAME,
        labels.PRIORITY_CLASS,
        labels.TOPOLOGY,
        labels.GPU_PRODUCT,
        labels.GPU_RESOURCE,
        labels.GPU_MILLI_RESOURCE,
        labels.GFD_PRODUCT,
        labels.DEFAULT_PRIORITY_CLASS,
        labels.DEFAULT_TIME_LIMIT,
        labels.MAX_TIME_LIMIT,
        labels.MAX_GPUS_PER_JOB,
        labels.DEFAULT_QUEUE,
    } <= used


def scheduler_names(doc: Doc) -> Iterator[str]:
    for key, text in strings(doc.obj):
        if key == "schedulerName":
            yield text
        yield from flag_values([text], "--scheduler-name")
    if doc.kind == "ConfigMap" and doc.name == "tessera-scheduler-config":
        yield from (p["schedulerName"] for p in scheduler_config()["profiles"])


def test_every_scheduler_name_is_the_extender_profile() -> None:
    names = [(doc.where, name) for doc in DOCS for name in scheduler_names(doc)]
    where = {w for w, _ in names}
    # The profile, the webhook's flag, and the example that names it itself.
    assert {
        "scheduler-config.yaml",
        "webhook-deployment.yaml",
        "examples/jobs/finetune.yaml",
    } <= where
    assert all(name == labels.DEFAULT_SCHEDULER_NAME for _, name in names), names


# ---------------------------------------------------------------- webhook configuration


def webhook() -> dict[str, Any]:
    (config,) = [d.obj for d in INSTALL if d.kind == "MutatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    found: dict[str, Any] = hook
    return found


def test_the_webhook_configuration_is_safe_for_reinvocation_and_fails_closed() -> None:
    hook = webhook()
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail"
    assert 1 <= hook["timeoutSeconds"] <= 10


def test_the_webhook_sees_jobs_jobsets_and_pods_on_create_and_update() -> None:
    rules = {
        (tuple(r["apiGroups"]), tuple(r["apiVersions"]), tuple(r["resources"]))
        for r in webhook()["rules"]
    }
    assert rules == {
        (("batch",), ("v1",), ("jobs",)),
        (("jobset.x-k8s.io",), ("v1alpha2",), ("jobsets",)),
        (("",), ("v1",), ("pods",)),
    }
    for rule in webhook()["rules"]:
        assert rule["operations"] == ["CREATE", "UPDATE"]
        assert rule.get("scope", "Namespaced") == "Namespaced"


def test_the_webhook_skips_kube_system_and_its_own_namespace() -> None:
    assert webhook()["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": labels.NAMESPACE_NAME,
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ]
    }


def test_match_conditions_look_for_a_queue_label_or_a_gpu_in_every_kind() -> None:
    conditions = {c["name"]: c["expression"] for c in webhook()["matchConditions"]}
    paths = {
        "job-with-queue-or-gpu": ("'jobs'", "object.spec.template.spec"),
        "jobset-with-queue-or-gpu": ("'jobsets'", "rj.template.spec.template.spec"),
        "pod-with-queue-or-gpu": ("'pods'", "object.spec"),
    }
    for name, (resource, spec) in paths.items():
        expression = conditions[name]
        # Only this kind is judged by this condition; the others pass it.
        assert expression.startswith(f"request.resource.resource != {resource} ||")
        assert f"'{labels.QUEUE_NAME}' in object.metadata.labels" in expression
        assert "has(object.metadata.labels)" in expression
        for field in ("containers", "initContainers"):
            assert f"has({spec}.{field}) ? {spec}.{field} : []" in expression
        for resource_name in (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE):
            for part in ("limits", "requests"):
                assert f"'{resource_name}' in c.resources.{part}" in expression
                assert f"has(c.resources.{part})" in expression
        assert expression.count("(") == expression.count(")")
    assert set(conditions) == {*paths, "not-made-by-a-job-controller"}


def test_binding_a_pod_never_waits_on_the_webhook() -> None:
    """The scheduler pod writes pods only through subresources (``pods/binding``, which
    also carries the extender's GPU annotation; ``pods/status``), which the webhook's
    ``pods`` rule does not match: no condition exempting the scheduler is needed."""
    config = webhook()
    for rule in config["rules"]:
        assert not any("/" in resource for resource in rule["resources"]), rule
    for condition in config["matchConditions"]:
        assert "tessera-scheduler" not in condition["expression"], condition["name"]


def test_only_objects_from_a_job_controller_naming_it_as_controller_skip_the_webhook() -> None:
    """Issue 20: any ownerReference to a Job or JobSet used to skip the call. The skip now
    needs ``controller: true`` and the controller's own username, the same usernames the
    webhook checks by default (the webhook also checks that the owner exists)."""
    expression = {c["name"]: c["expression"] for c in webhook()["matchConditions"]}[
        "not-made-by-a-job-controller"
    ]
    assert expression.startswith("!has(object.metadata.ownerReferences) ||")
    assert "has(o.controller) && o.controller == true" in expression
    for field in ("kind", "apiVersion"):
        assert f"has(o.{field})" in expression
    job_branch, jobset_branch = expression.split("(o.kind == ")[1:]
    assert job_branch.startswith("'Job' && o.apiVersion == 'batch/v1'")
    assert jobset_branch.startswith("'JobSet' && o.apiVersion.startsWith('jobset.x-k8s.io/')")
    for branch, usernames in (
        (job_branch, JOB_CONTROLLER_USERNAMES),
        (jobset_branch, JOBSET_CONTROLLER_USERNAMES),
    ):
        (listed,) = re.findall(r"request\.userInfo\.username in\s*\[([^\]]*)\]", branch)
        assert re.findall(r"'([^']*)'", listed) == list(usernames)
    assert expression.count("(") == expression.count(")")


def test_the_webhook_is_called_through_its_service_with_a_certificate_make_certs_issues() -> None:
    client = webhook()["clientConfig"]
    service = one("Service", "tessera-webhook")
    assert client["service"] == {
        "name": "tessera-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }
    assert service["metadata"]["namespace"] == NAMESPACE
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    deployment = one("Deployment", "tessera-webhook")
    (container_port,) = [
        p for p in container(deployment, "webhook")["ports"] if p["name"] == "https"
    ]
    assert port["targetPort"] == container_port["name"]
    assert container_port["containerPort"] == 8443
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (leaf,) = [leaf for leaf in make_plan().leaves() if leaf.name == "webhook"]
    assert f"tessera-webhook.{NAMESPACE}.svc" in leaf.dns_names


def test_the_ca_bundle_is_the_placeholder_or_a_pem_certificate() -> None:
    """Empty as committed; `make certs` writes the CA there (and the test still passes)."""
    bundle = webhook()["clientConfig"]["caBundle"]
    if bundle == "":
        return
    try:
        decoded = base64.b64decode(bundle, validate=True)
    except binascii.Error:
        pytest.fail("caBundle is neither empty nor base64")
    assert decoded.startswith(b"-----BEGIN CERTIFICATE-----")


def test_make_certs_can_patch_the_ca_bundle_into_the_webhook_configuration() -> None:
    path = MANIFESTS / "webhook-configuration.yaml"
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n").decode()
    patched = set_ca_bundle(path.read_text(encoding="utf-8"), bundle)
    assert patched.webhooks == 1
    (config,) = yaml.safe_load_all(patched.text)
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == bundle


# ---------------------------------------------------------------- RBAC


def rules(role: dict[str, Any]) -> set[tuple[tuple[str, ...], ...]]:
    return {
        (
            tuple(rule.get("apiGroups", [])),
            tuple(rule.get("resources", [])),
            tuple(sorted(rule.get("verbs", []))),
            tuple(rule.get("resourceNames", [])),
        )
        for rule in role["rules"]
    }


def test_the_webhook_only_reads_kueue_queue_objects_quotas_and_the_owners_of_pods() -> None:
    assert rules(one("ClusterRole", "tessera-webhook")) == {
        (
            ("kueue.x-k8s.io",),
            (
                "localqueues",
                "clusterqueues",
                "resourceflavors",
                "topologies",
                "workloadpriorityclasses",
            ),
            ("get", "list", "watch"),
            (),
        ),
        (("",), ("resourcequotas",), ("list", "watch"), ()),
        (("batch",), ("jobs",), ("get", "list", "watch"), ()),
        (("jobset.x-k8s.io",), ("jobsets",), ("get", "list", "watch"), ()),
    }


def test_the_extender_watches_nodes_and_pods_and_binds_nothing_more() -> None:
    """No ``patch`` or ``update`` on pods: the GPU annotation travels in the Binding.
    Whoever may patch any pod may change any pod's image. ResourceFlavors only label its
    capacity metrics: read, never written."""
    assert rules(one("ClusterRole", "tessera-extender")) == {
        (("",), ("nodes",), ("get", "list", "watch"), ()),
        (("",), ("pods",), ("get", "list", "watch"), ()),
        (("",), ("pods/binding",), ("create",), ()),
        (("kueue.x-k8s.io",), ("resourceflavors",), ("list", "watch"), ()),
    }


def test_the_console_reads_queues_and_pods_and_writes_only_node_annotations_events_and_jobs() -> (
    None
):
    """What ``tessera`` does with it: ``nodes``/``queues`` list, ``drain``/``undrain``/
    ``gpu-health`` get and patch a node and create an Event, ``sbatch`` creates a Job,
    ``why`` gets the object asked about and lists its namespace's events (and ResourceQuotas,
    which ``queues`` and ``capacity`` list too), and reads the
    extenders' /debug/reasons through the pod proxy in tessera-system only, and the
    Leases there that record reservations (``nodes`` shows them). Left
    unbound: an admin binds it to the platform team."""
    assert rules(one("ClusterRole", "tessera-console")) == {
        (("",), ("nodes",), ("get", "list", "patch"), ()),
        (("",), ("pods",), ("get", "list"), ()),
        (("",), ("events",), ("create", "list"), ()),
        (("",), ("resourcequotas",), ("list",), ()),
        (
            ("kueue.x-k8s.io",),
            (
                "clusterqueues",
                "localqueues",
                "resourceflavors",
                "topologies",
                "workloadpriorityclasses",
                "workloads",
            ),
            ("list",),
            (),
        ),
        (("batch",), ("jobs",), ("create", "get"), ()),
        (("jobset.x-k8s.io",), ("jobsets",), ("get",), ()),
    }
    proxy = one("Role", "tessera-console-extender")
    assert proxy["metadata"]["namespace"] == NAMESPACE
    assert rules(proxy) == {
        (("",), ("pods/proxy",), ("get",), ()),
        (("coordination.k8s.io",), ("leases",), ("get", "list"), ()),
    }


def test_kube_scheduler_may_renew_only_its_own_lease() -> None:
    role = one("Role", "tessera-scheduler-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == {
        (("coordination.k8s.io",), ("leases",), ("get", "update"), ("tessera-scheduler",))
    }


def test_the_extender_records_reservations_as_leases_of_its_own_namespace_only() -> None:
    role = one("Role", "tessera-extender-reservations")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == {
        (("coordination.k8s.io",), ("leases",), ("create", "delete", "list", "patch"), ())
    }


def bindings() -> set[tuple[str, str, str, str, str]]:
    """(binding kind, its namespace, role kind, role name, subject) for every binding."""
    found = set()
    for doc in INSTALL:
        if doc.kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        for subject in doc.obj["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == NAMESPACE
            found.add(
                (
                    doc.kind,
                    doc.obj["metadata"].get("namespace", ""),
                    doc.obj["roleRef"]["kind"],
                    doc.obj["roleRef"]["name"],
                    subject["name"],
                )
            )
    return found


def test_each_service_account_is_bound_to_exactly_what_it_needs() -> None:
    assert bindings() == {
        ("ClusterRoleBinding", "", "ClusterRole", "tessera-webhook", "tessera-webhook"),
        ("ClusterRoleBinding", "", "ClusterRole", "tessera-extender", SCHEDULER_SA),
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler", SCHEDULER_SA),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler", SCHEDULER_SA),
        (
            "RoleBinding",
            "kube-system",
            "Role",
            "extension-apiserver-authentication-reader",
            SCHEDULER_SA,
        ),
        ("RoleBinding", NAMESPACE, "Role", "tessera-scheduler-leader-election", SCHEDULER_SA),
        ("RoleBinding", NAMESPACE, "Role", "tessera-extender-reservations", SCHEDULER_SA),
    }
    roles = {(d.kind, d.name) for d in INSTALL if d.kind in ("ClusterRole", "Role")}
    assert roles == {
        ("ClusterRole", "tessera-webhook"),
        ("ClusterRole", "tessera-extender"),
        ("ClusterRole", "tessera-console"),
        ("Role", "tessera-console-extender"),
        ("Role", "tessera-scheduler-leader-election"),
        ("Role", "tessera-extender-reservations"),
    }


def test_each_deployment_runs_as_its_own_service_account() -> None:
    assert pod_spec(one("Deployment", "tessera-webhook"))["serviceAccountName"] == "tessera-webhook"
    assert pod_spec(one("Deployment", "tessera-scheduler"))["serviceAccountName"] == SCHEDULER_SA
    accounts = {d.name for d in INSTALL if d.kind == "ServiceAccount"}
    assert accounts == {"tessera-webhook", SCHEDULER_SA}


# ---------------------------------------------------------------- scheduler


def test_the_scheduler_profile_calls_the_extender_sidecar_for_gpu_pods() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [labels.DEFAULT_SCHEDULER_NAME]
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert extender.get("enableHTTPS", False) is False
    assert (
        extender["filterVerb"],
        extender["prioritizeVerb"],
        extender["bindVerb"],
        extender["preemptVerb"],
    ) == ("filter", "prioritize", "bind", "preempt")
    assert isinstance(extender["weight"], int)
    assert extender["weight"] >= 1
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert re.fullmatch(r"[0-9]+(ms|s)", extender["httpTimeout"])
    assert extender["managedResources"] == [
        {"name": labels.GPU_RESOURCE, "ignoredByScheduler": False},
        {"name": labels.GPU_MILLI_RESOURCE, "ignoredByScheduler": True},
    ]


def test_the_scheduler_elects_a_leader_on_the_lease_its_role_grants() -> None:
    election = scheduler_config()["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] == "tessera-scheduler"
    assert election["resourceNamespace"] == NAMESPACE
    assert scheduler_config()["clientConnection"]["kubeconfig"] == ""  # in-cluster


def test_the_extender_sidecar_listens_where_the_scheduler_calls_it() -> None:
    deployment = one("Deployment", "tessera-scheduler")
    spec = pod_spec(deployment)
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "extender"
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "tessera"
    assert sidecar["args"][0] == "extender"
    assert flag_values(sidecar["args"], "--port") == ["8888"]
    # No TLS flags: the extender then binds to loopback only.
    assert not [a for a in sidecar["args"] if a.startswith("--tls")]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "http://127.0.0.1:8888/" in sidecar[probe]["exec"]["command"][-1]

    scheduler = container(deployment, "kube-scheduler")
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    (config_path,) = flag_values(scheduler["command"], "--config")
    (mount,) = scheduler["volumeMounts"]
    assert config_path == f"{mount['mountPath']}/config.yaml"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "tessera-scheduler-config"


def test_the_extender_sidecars_settings_choose_in_filter_over_the_example_levels() -> None:
    sidecar = container(one("Deployment", "tessera-scheduler"), "extender")
    environ = {e["name"]: e["value"] for e in sidecar["env"]}
    config = parse_settings(sidecar["args"][1:], environ).to_config()
    # kube-scheduler gets one node for a pod without preferences of its own, and binds
    # it there unscored; /prioritize stays configured for the pods that have some
    assert config.choose_in_filter is True
    assert scheduler_config()["extenders"][0]["prioritizeVerb"] == "prioritize"
    # the levels the load tests' nodes carry (sched-perf runs the extender with this env)
    assert config.level_labels == tuple(label for _, label in parse_topology_levels(LEVELS))
    # and sched-perf and the e2e stack read that very env out of the manifests
    assert install._server_env([doc.obj for doc in INSTALL], "extender") == environ


# ---------------------------------------------------------------- metrics and deadlines


def test_metrics_have_a_port_of_their_own_that_no_service_exposes() -> None:
    """Whoever reaches the webhook's Service (or the extender's /bind) must not read the
    queues, namespaces and load that /metrics counts; Prometheus scrapes the pods'
    port named metrics."""
    servers = [
        (one("Deployment", "tessera-webhook"), "webhook", "8080"),
        (one("Deployment", "tessera-scheduler"), "extender", "8889"),
    ]
    exposed = {
        (port.get("targetPort"), port["port"])
        for doc in INSTALL
        if doc.kind == "Service"
        for port in doc.obj["spec"]["ports"]
    }
    for deployment, name, metrics_port in servers:
        server = container(deployment, name)
        assert flag_values(server["args"], "--metrics-port") == [metrics_port]
        assert flag_values(server["args"], "--metrics-host") == ["0.0.0.0"]
        (declared,) = [p for p in server["ports"] if p["name"] == "metrics"]
        assert declared["containerPort"] == int(metrics_port)
        assert flag_values(server["args"], "--port") != [metrics_port]
        assert not {("metrics", int(metrics_port))} & exposed
        assert not [p for _, p in exposed if p == int(metrics_port)]


def test_the_extenders_deadline_is_kube_schedulers_http_timeout() -> None:
    """An answer after httpTimeout is thrown away: the extender must not count on more."""
    (extender,) = scheduler_config()["extenders"]
    sidecar = container(one("Deployment", "tessera-scheduler"), "extender")
    given = flag_values(sidecar["args"], "--request-timeout")
    timeout = float(given[0]) if given else ExtenderSettings().request_timeout_s
    assert timeout == parse_go_duration(extender["httpTimeout"])


def test_the_webhooks_timeout_is_one_the_webhook_honours() -> None:
    assert webhook()["timeoutSeconds"] <= MAX_TIMEOUT_S


@pytest.mark.parametrize(
    ("name", "server", "grace"),
    [
        ("tessera-webhook", "webhook", WebhookSettings().shutdown_grace_s),
        ("tessera-scheduler", "extender", ExtenderSettings().shutdown_grace_s),
    ],
)
def test_the_pod_waits_longer_than_the_server_drains(name: str, server: str, grace: float) -> None:
    """SIGTERM, then the kubelet kills after terminationGracePeriodSeconds (30 s unless
    set): the requests under way must be able to finish before that."""
    deployment = one("Deployment", name)
    given = flag_values(container(deployment, server)["args"], "--shutdown-grace")
    drain = float(given[0]) if given else grace
    assert pod_spec(deployment).get("terminationGracePeriodSeconds", 30) > drain


# ---------------------------------------------------------------- deployments


def deployments() -> list[dict[str, Any]]:
    return [d.obj for d in INSTALL if d.kind == "Deployment"]


def test_every_deployment_runs_non_root_read_only_without_capabilities() -> None:
    assert len(deployments()) == 2
    for deployment in deployments():
        spec = pod_spec(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec.get("hostNetwork", False) is False
        for c in containers(deployment):
            context = c["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, c["name"]
            assert context["allowPrivilegeEscalation"] is False, c["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert context.get("privileged", False) is False, c["name"]
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][part]), (c["name"], part)


def test_every_deployment_has_two_replicas_spread_and_a_disruption_budget() -> None:
    budgets = [d.obj for d in INSTALL if d.kind == "PodDisruptionBudget"]
    for deployment in deployments():
        assert deployment["spec"]["replicas"] == 2
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        (term,) = pod_spec(deployment)["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["topologyKey"] == labels.HOSTNAME
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
        (budget,) = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        ]
        assert budget["spec"]["minAvailable"] == 1


def test_the_webhook_serves_tls_from_the_secret_and_is_probed() -> None:
    deployment = one("Deployment", "tessera-webhook")
    spec = pod_spec(deployment)
    server = container(deployment, "webhook")
    assert server["image"] == "tessera"
    assert server["args"][0] == "webhook"
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "tessera-webhook-tls"
    assert flag_values(server["args"], "--tls-cert") == [f"{mount['mountPath']}/tls.crt"]
    assert flag_values(server["args"], "--tls-key") == [f"{mount['mountPath']}/tls.key"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert server["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["scheme"] == "HTTPS"


def test_everything_namespaced_lives_in_tessera_system() -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
    }
    for doc in INSTALL:
        namespace = doc.obj["metadata"].get("namespace")
        if doc.kind in cluster_scoped:
            assert namespace is None, doc.name
        elif doc.kind == "RoleBinding" and namespace == "kube-system":
            assert doc.obj["roleRef"]["name"] == "extension-apiserver-authentication-reader"
        else:
            assert namespace == NAMESPACE, (doc.kind, doc.name)


# ---------------------------------------------------------------- kustomizations


def kustomizations() -> list[Path]:
    return sorted(MANIFESTS.rglob("kustomization.yaml"))


def test_the_install_the_examples_and_monitoring_are_separate_kustomizations() -> None:
    """Monitoring needs the Prometheus Operator's CRDs, which the install does not."""
    assert kustomizations() == [
        MANIFESTS / "examples" / "kustomization.yaml",
        MANIFESTS / "kustomization.yaml",
        MANIFESTS / "monitoring" / "kustomization.yaml",
    ]


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_each_kustomization_lists_every_file_in_its_folder(path: Path) -> None:
    kustomization = yaml.safe_load(path.read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    files = {p.name for p in path.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert set(listed) == files


def test_example_jobs_are_created_not_applied() -> None:
    """jobs/ holds workloads only, outside any kustomization: the seed's Job has a
    generateName, which kustomize and `kubectl apply` refuse."""
    jobs = [d for d in DOCS if d.path.parent == MANIFESTS / "examples" / "jobs"]
    assert {d.kind for d in jobs} <= {"Job", "JobSet", "Pod"}
    assert any("generateName" in d.obj["metadata"] for d in jobs)
    assert not (MANIFESTS / "examples" / "jobs" / "kustomization.yaml").exists()


def test_kueue_objects_use_the_storage_version() -> None:
    versions = {
        d.obj["apiVersion"] for d in DOCS if str(d.obj.get("apiVersion", "")).startswith("kueue.")
    }
    assert versions == {"kueue.x-k8s.io/v1beta2"}
