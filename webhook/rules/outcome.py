"""What the rules read of the settings, and the decisions they make.

Layer: PURE. Frozen records and the message helpers the rules share: no I/O, no clock, no
aiohttp, no pydantic. Must not decide anything itself (``webhook.rules.*`` do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels
from webhook.owners import DEFAULT_CONTROLLERS, ControllerUsers, OwnerKey
from webhook.queues import ClusterQueue, Flavor, LocalQueue
from webhook.workload import Path

FORBIDDEN: Final = 403
"""The object is well-formed but the cluster's policy does not allow it."""
INVALID: Final = 422
"""The object carries a value that cannot be right (a malformed or immutable field)."""

DEFAULT_SCHEDULER: Final = "default-scheduler"
"""What kube-apiserver writes into ``schedulerName`` when the user chose nothing."""
UNKNOWN_QUEUE: Final = "unknown"
"""The ``queue`` a decision reports (for metrics) when the object names a LocalQueue that
does not exist: what it names is the user's to choose, and must not become a label."""

Notes = tuple[str, ...]
"""Warnings a rule returns for the user (kubectl prints them)."""
GangSlots = tuple[Path, ...]
"""Label maps, by path in the object, where the gang id goes (``rule_gang``)."""


# ---------------------------------------------------------------- config and decisions


@dataclass(frozen=True, slots=True)
class AdmitConfig:
    """The few settings the rules read; built once by the app from its settings."""

    scheduler_name: str = labels.DEFAULT_SCHEDULER_NAME
    managed_namespaces: frozenset[str] = frozenset()
    """Namespaces where a GPU workload without a queue is denied; ``*`` means all."""
    controllers: ControllerUsers = DEFAULT_CONTROLLERS
    """Who the Job and JobSet controllers' requests come from (``webhook.owners``)."""

    def manages(self, namespace: str) -> bool:
        return namespace in self.managed_namespaces or "*" in self.managed_namespaces


@dataclass(frozen=True, slots=True)
class Allowed:
    """Admit ``object`` (the mutated copy, or the request's object when unchanged)."""

    object: Mapping[str, Any]
    warnings: Notes = ()
    reason: str = "admitted"
    """For metrics: ``admitted``, ``validated`` or why the object was let through as is."""
    queue: str = ""
    """For metrics: a LocalQueue of the policy, ``UNKNOWN_QUEUE``, or empty (none named)."""
    unconfirmed: OwnerKey | None = None
    """The controller the object claims, which the view lacked: found by one GET, it
    would let the object through as is (see ``admit``)."""
    gang_slots: GangSlots = ()
    """The label maps of ``object`` where the gang id made from the name goes
    (``rule_gang``); empty once ``name_gang`` wrote it, or when none is needed."""


@dataclass(frozen=True, slots=True)
class Denied:
    """Reject, with HTTP-style ``code`` (403 or 422) and a message a person can act on."""

    code: int
    reason: str
    """For metrics: the rule that denied (``queue``, ``quota``, …)."""
    message: str
    queue: str = ""
    """For metrics: a LocalQueue of the policy, ``UNKNOWN_QUEUE``, or empty (none named)."""
    unconfirmed: OwnerKey | None = None
    """As ``Allowed.unconfirmed``."""

    @property
    def status_reason(self) -> str:
        """The ``metav1.Status`` reason for ``code``."""
        return "Invalid" if self.code == INVALID else "Forbidden"


Decision = Allowed | Denied


@dataclass(frozen=True, slots=True)
class QueueChoice:
    """The queue a workload goes to, and how it was chosen."""

    local: LocalQueue
    cluster: ClusterQueue
    defaulted: bool = False

    def __str__(self) -> str:
        return f"queue {self.local.name} (ClusterQueue {self.cluster.name})"


@dataclass(frozen=True, slots=True)
class FlavorChoice:
    """The queue's GPU flavors the workload may use, in the queue's order."""

    flavors: tuple[Flavor, ...]
    warnings: Notes = ()


# ---------------------------------------------------------------- message helpers


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def names(items: Iterable[str]) -> str:
    return ", ".join(items) or "none"
