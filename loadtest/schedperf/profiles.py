"""The three kube-scheduler configurations ``sched-perf`` compares, from the shipped one.

Layer: PURE (dicts in, dicts out; no I/O). Must not change the shipped ``tessera-gpu``
profile beyond where its extender is reached: that profile is what is measured.

* ``tessera``: ``manifests/scheduler-config.yaml`` as shipped, its extender pointed at
  the local process.
* ``in_tree``: the same schedulerName with no extender, ``NodeResourcesFit`` scoring
  ``MostAllocated`` on ``nvidia.com/gpu`` (and on ``tessera.dev/gpu-milli``, which in-tree
  sees as one more extended resource of the node): the fair GPU baseline, since it packs
  as Tessera does.
* ``in_tree_default``: the same schedulerName with kube-scheduler's defaults (its scoring
  spreads pods over nodes).

All three keep the shipped ``clientConnection`` (QPS and burst), so no profile binds
faster only because its API client may send more requests a second; and all three use
the same schedulerName, so the pods they schedule are byte for byte the same.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from cluster import labels

Obj = dict[str, Any]

IN_TREE: Final = "in_tree"
IN_TREE_DEFAULT: Final = "in_tree_default"
TESSERA: Final = "tessera"
PROFILES: Final = (IN_TREE, IN_TREE_DEFAULT, TESSERA)
API_VERSION: Final = "kubescheduler.config.k8s.io/v1"
KIND: Final = "KubeSchedulerConfiguration"
PACKED_RESOURCES: Final = (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE)


def scheduler_name(shipped: Mapping[str, Any]) -> str:
    """The schedulerName of the shipped profile that runs the extender."""
    for profile in shipped.get("profiles") or []:
        return str(profile.get("schedulerName", labels.DEFAULT_SCHEDULER_NAME))
    return labels.DEFAULT_SCHEDULER_NAME


def client_connection(shipped: Mapping[str, Any]) -> Obj:
    """The shipped client settings that all profiles share (QPS, burst, content type);
    the kubeconfig is filled in where kube-scheduler is started."""
    connection = dict(shipped.get("clientConnection") or {})
    connection.pop("kubeconfig", None)
    return connection


def order(repeat: int) -> tuple[str, ...]:
    """The profiles in the order of repeat ``repeat`` (0-based): forward, then backward,
    so that a slow spell of the shared machine does not always fall on the same one."""
    return PROFILES if repeat % 2 == 0 else tuple(reversed(PROFILES))


def scheduler_config(profile: str, shipped: Mapping[str, Any], extender_url: str) -> Obj:
    """The KubeSchedulerConfiguration kube-scheduler runs with for ``profile``."""
    name = scheduler_name(shipped)
    base: Obj = {"apiVersion": API_VERSION, "kind": KIND}
    connection = client_connection(shipped)
    if connection:
        base["clientConnection"] = connection
    if profile == TESSERA:
        config = copy.deepcopy(dict(shipped))
        for extender in config.get("extenders") or []:
            extender["urlPrefix"] = extender_url
            # plain HTTP on loopback, as the sidecar it is in the manifests
            extender.pop("tlsConfig", None)
            extender.pop("enableHTTPS", None)
        config.pop("leaderElection", None)
        config["clientConnection"] = connection
        return config
    if profile == IN_TREE:
        strategy = {
            "type": "MostAllocated",
            "resources": [{"name": r, "weight": 1} for r in PACKED_RESOURCES],
        }
        args = {"scoringStrategy": strategy}
        return {
            **base,
            "profiles": [
                {
                    "schedulerName": name,
                    "pluginConfig": [{"name": "NodeResourcesFit", "args": args}],
                }
            ],
        }
    if profile == IN_TREE_DEFAULT:
        return {**base, "profiles": [{"schedulerName": name}]}
    raise ValueError(f"unknown profile {profile!r}: one of {', '.join(PROFILES)}")
