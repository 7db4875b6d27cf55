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

One change to the shipped profile may be asked for: its ``percentageOfNodesToScore``
(``--nodes-to-score``), so that a sample can be measured against the shipped value side
by side before the manifest changes; 0 leaves the field out (kube-scheduler's adaptive
sample). The in-tree profiles always sample adaptively, as kube-scheduler does by default.
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


NODES_TO_SCORE: Final = "percentageOfNodesToScore"
ADAPTIVE: Final = 0
"""``percentageOfNodesToScore`` 0: the field left out, kube-scheduler's adaptive sample."""


def nodes_to_score(shipped: Mapping[str, Any]) -> int:
    """The shipped extender profile's ``percentageOfNodesToScore`` (else the
    configuration's own), ``ADAPTIVE`` when neither says."""
    first: Mapping[str, Any] = next(iter(shipped.get("profiles") or []), {})  # the extender's
    found = first.get(NODES_TO_SCORE, shipped.get(NODES_TO_SCORE))
    return ADAPTIVE if found is None else int(found)


def checked_percent(value: int) -> int:
    """``value`` if kube-scheduler takes it as ``percentageOfNodesToScore``, else ValueError."""
    if not 0 <= value <= 100:
        raise ValueError(f"{NODES_TO_SCORE} {value}: a percentage from 0 to 100")
    return value


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


def scheduler_config(
    profile: str,
    shipped: Mapping[str, Any],
    extender_url: str,
    *,
    nodes_to_score: int | None = None,
) -> Obj:
    """The KubeSchedulerConfiguration kube-scheduler runs with for ``profile``;
    ``nodes_to_score`` (``tessera`` only; None: as shipped) its nodes to score, in %."""
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
        if nodes_to_score is not None:
            _set_nodes_to_score(config, nodes_to_score)
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


def _set_nodes_to_score(config: Obj, percent: int) -> None:
    """``percent`` of the nodes scored by every profile of ``config``; ``ADAPTIVE``: the
    field left out everywhere, so that kube-scheduler's own sample size applies."""
    checked_percent(percent)
    config.pop(NODES_TO_SCORE, None)
    for one in config.get("profiles") or []:
        if percent == ADAPTIVE:
            one.pop(NODES_TO_SCORE, None)
        else:
            one[NODES_TO_SCORE] = percent
