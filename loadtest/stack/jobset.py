"""The real JobSet controller manager on loopback, as an admin would install it next to
Kueue and Tessera.

Layer: I/O (test support: certificates, files, one process, objects through the API). The
manager is the pinned release that ``tests/e2e/build_binaries.sh jobset`` builds; its
webhooks are the ones that release registers (``config/components/webhook/manifests.yaml``
with the patches of its kustomization), reached by ``url:`` instead of a Service. Must not
decide anything about JobSet's, Kueue's or Tessera's behaviour: the scenarios assert it.

What it takes to run JobSet without a Service in front of it (see tests/e2e/README.md):

* it runs as its own ServiceAccount, ``jobset-controller-manager`` in ``jobset-system``
  (a TokenRequest token, as its pod would mount it), with the ClusterRoles of its release:
  its child Jobs then come from the username that Tessera's match condition and
  ``--jobset-controller-usernames`` trust, and from no other (issue 20: an ownerReference
  alone proves nothing). Run as cluster admin, its children would reach Tessera's webhook
  and be judged as workloads of their own;
* internal certificate management is off, as in JobSet's cert-manager install: with it on,
  the rotator waits for the pair at the fixed path ``/tmp/k8s-webhook-server/serving-certs``,
  which every stack on the machine would share. The stack plays cert-manager instead: it
  writes a pair that names 127.0.0.1 (``loadtest/stack/kubebuilder.py``) into the
  ``certDir`` of the webhook and metrics servers, and the CA into the webhook
  configurations;
* every listener is on 127.0.0.1, and leader election is off.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from cluster import labels
from loadtest.ports import LOOPBACK
from loadtest.stack import kubebuilder
from loadtest.stack.controlplane import ControlPlane
from loadtest.stack.install import Identity
from loadtest.stack.kubebuilder import ManagerPorts
from loadtest.stack.servers import Probe, ServerProcess

NAMESPACE: Final = "jobset-system"
NAME_PREFIX: Final = "jobset-"
"""What JobSet's ``config/default`` kustomization prefixes every object's name with."""
SERVICE: Final = "jobset-webhook-service"
IDENTITY: Final = Identity(NAMESPACE, "jobset-controller-manager")
"""The ServiceAccount JobSet's release manifests run the manager as."""
CLUSTER_ROLES: Final = ("role.yaml", "auth_proxy_role.yaml")
"""The release's ClusterRoles (``config/``): the manager's, and the one its metrics
server needs to authenticate and authorize scrapers."""
POD_WEBHOOKS: Final = frozenset({"mpod.kb.io", "vpod.kb.io"})
"""Webhooks that JobSet's kustomization narrows to the pods of JobSets."""
_JOBSET_PODS_ONLY: Final = {
    "objectSelector": {"matchExpressions": [{"key": labels.JOBSET_NAME, "operator": "Exists"}]}
}


def configuration(ports: ManagerPorts, cert_dir: Path) -> dict[str, Any]:
    """The manager's ``Configuration``: the release's defaults where they work on loopback."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports.health}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{ports.metrics}", "certDir": str(cert_dir)},
        "webhook": {"host": LOOPBACK, "port": ports.webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def webhook_configurations(
    documents: Iterable[Mapping[str, Any]], port: int, ca_bundle: str
) -> list[dict[str, Any]]:
    """JobSet's webhook configurations as its install registers them, each ``clientConfig``
    a URL on loopback."""
    return kubebuilder.webhook_configurations(
        documents,
        name_prefix=NAME_PREFIX,
        port=port,
        ca_bundle=ca_bundle,
        patches=dict.fromkeys(POD_WEBHOOKS, _JOBSET_PODS_ONLY),
    )


def rbac(release: Path) -> list[dict[str, Any]]:
    """The manager's ServiceAccount, the release's ClusterRoles (named as its install
    names them) and a binding of each to the ServiceAccount. Not the Role on Secrets,
    which only its certificate rotator (off here) uses."""
    roles = [
        doc
        for name in CLUSTER_ROLES
        for doc in yaml.safe_load_all((release / "config" / name).read_text())
        if isinstance(doc, dict) and doc.get("kind") == "ClusterRole"
    ]
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": IDENTITY.name, "namespace": IDENTITY.namespace},
        }
    ]
    for role in roles:
        name = NAME_PREFIX + role["metadata"]["name"]
        out.append({**role, "metadata": {"name": name}})
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name.removesuffix("-role") + "-rolebinding"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": IDENTITY.name,
                        "namespace": IDENTITY.namespace,
                    }
                ],
            }
        )
    return out


def start_jobset(
    plane: ControlPlane,
    release: Path,
    workdir: Path,
    now: datetime.datetime,
    kubeconfig_for: Callable[[Identity], Path],
) -> ServerProcess:
    """JobSet's manager, running as ``IDENTITY`` with its webhooks registered; returns its
    process. ``kubeconfig_for`` gives a kubeconfig acting as a ServiceAccount (as its pod
    would mount its token).

    The order is an install's: namespace, RBAC and webhook configurations first, then the
    manager, which is ready once its webhook server listens."""
    workdir.mkdir(parents=True, exist_ok=True)
    certs = kubebuilder.make_certs(
        now, organization="jobset", ca_name="jobset-ca", service=SERVICE, namespace=NAMESPACE
    )
    ports = ManagerPorts.pick()
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rbac(release), sort_keys=False))
    documents = yaml.safe_load_all((release / "config" / "webhooks.yaml").read_text())
    configs = webhook_configurations(
        [d for d in documents if isinstance(d, dict)], ports.webhook, certs.ca_bundle
    )
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(configs, sort_keys=False))

    cert_dir = certs.write_cert_dir(workdir / "certs")
    config_path = workdir / "jobset-config.yaml"
    config_path.write_text(yaml.safe_dump(configuration(ports, cert_dir), sort_keys=False))
    process = ServerProcess(
        "jobset",
        [f"--config={config_path}", f"--kubeconfig={kubeconfig_for(IDENTITY)}",
         "--zap-log-level=info"],
        workdir.parent / "logs" / "jobset.log",
        Probe(ports.health, "/readyz"),
        program=release / "bin" / "jobset",
    )  # fmt: skip
    process.start(timeout=90.0)
    return process
