"""What every filter and scorer reads about the pod of one request, and what they answer.

Layer: PURE. Frozen values built once per request (``extender.gangs.build_context``
builds a ``PodContext``): no I/O, no clock (the request's time is a value here), no
settings, no aiohttp. Must not judge a node: that is ``extender.filters`` and
``extender.scores``.

* A filter answers ``FIT`` or ``Unfit(reason, resolvable)``. The reason is written for
  the person reading ``kubectl describe pod``; ``resolvable`` says whether evicting pods
  from the node could ever help (kube-scheduler tries preemption only where it could).
* ``PodContext.memo`` is the decision cache of the request's config
  (``extender.memo.DecisionCache``), the part of a decision that outlives the request;
  the context itself lives for one request only, like kube-scheduler's ``CycleState``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, TypeAlias

from cluster.model import GangSpec, NodeName, PodDemand, PodKey, Promise
from extender.config import ExtenderConfig, TopologyLevel
from extender.memo import DecisionCache, FitShape, NodeMemo, ScoreShape, ShapeKey

# ---------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class Fit:
    """The node can take the pod, as far as this filter can tell."""


FIT: Final = Fit()


@dataclass(frozen=True, slots=True)
class Unfit:
    """The node cannot take the pod: why, and whether evicting pods could change that."""

    reason: str
    resolvable: bool


Verdict: TypeAlias = Fit | Unfit


# ---------------------------------------------------------------- the gang


@dataclass(frozen=True, slots=True)
class DomainRooms:
    """How many members of a gang each topology domain at one level can hold, and what
    each node counted there holds. Read-only views of the kept room count
    (``extender.gangs``), not copies: a first member's request reads a few domains of
    hundreds, and a few nodes of thousands."""

    free: Mapping[str, int]
    """Members that fit on the domain's free GPUs now."""
    total: Mapping[str, int]
    """Members that would fit if no other pod held a GPU there."""
    fits_on: Mapping[NodeName, int]
    """Members each counted node holds now, draining nodes aside."""
    draining_fits: Mapping[NodeName, int]
    """The same for the draining nodes this pod may use (counted in ``free`` too)."""
    withheld: frozenset[NodeName] = frozenset()
    """Nodes reserved for another gang, which the pod may not use: not counted."""

    def node_fits(self, name: NodeName) -> int | None:
        """Members ``name`` holds now as counted here; None if it is not counted."""
        if name in self.withheld:
            return None
        found = self.fits_on.get(name)
        return found if found is not None else self.draining_fits.get(name)


@dataclass(frozen=True, slots=True)
class GangView:
    """A pod's gang as the snapshot shows it, computed once per request."""

    spec: GangSpec
    members: tuple[NodeName, ...]
    """Nodes of the members placed or assumed so far (this pod excluded), one per member."""
    required: TopologyLevel | None = None
    preferred: TopologyLevel | None = None
    unknown_level: str | None = None
    """``required:<level>`` names a level the extender does not know."""
    member_domains: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per level node label (and ``""`` for the node itself): members per domain value."""
    members_located: int = 0
    """Members whose node the snapshot knows (those counted in ``member_domains``)."""
    allowed_domains: frozenset[str] | None = None
    """``required``: the domain(s) at that level holding the most placed members."""
    rooms: DomainRooms | None = None
    """No member placed yet and a level to keep to: room per domain value at that level."""
    reasons: dict[Hashable, Unfit] = field(default_factory=dict, compare=False, repr=False)
    """The gang filters' verdicts, each written once per request: one for a node outside
    ``allowed_domains``, one per (room, resolvable) for a domain without room."""

    @property
    def refuses_nodes(self) -> bool:
        """Whether the gang filters can refuse a node: only with a ``required`` level,
        known or not. Otherwise a member's verdicts are those of a pod of its shape
        outside any gang."""
        return self.required is not None or self.unknown_level is not None

    @property
    def level(self) -> TopologyLevel | None:
        return self.required or self.preferred


# ---------------------------------------------------------------- the pod

_NO_PROMISES: Final[Mapping[NodeName, tuple[Promise, ...]]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PodContext:
    """What every filter and scorer reads about the pod, built once per request.

    ``memo`` must be a cache of ``config`` (``ValueError`` otherwise); a caller with
    nothing to remember across requests passes a fresh one.
    """

    pod: PodKey
    demand: PodDemand
    now: datetime
    config: ExtenderConfig
    gang: GangView | None = None
    promises: Mapping[NodeName, tuple[Promise, ...]] = field(
        default_factory=lambda: _NO_PROMISES, repr=False, compare=False
    )
    """Per node held by a gang's reservation, its promises (``Snapshot.promises``)."""
    memo: DecisionCache = field(kw_only=True, repr=False, compare=False)
    shape: ShapeKey = field(init=False, repr=False, compare=False)
    """What the node-only filters read of the pod: the key of their verdicts."""
    fit_shape: FitShape = field(init=False, repr=False, compare=False)
    """What ``pod_fits`` reads of the pod: the key of how many such pods a node holds."""
    score_shape: ScoreShape = field(init=False, repr=False, compare=False)
    """What the node-only scorers read of the pod: the key of their part of the score."""
    verdicts: NodeMemo = field(init=False, repr=False, compare=False)
    fits: NodeMemo = field(init=False, repr=False, compare=False)
    scores: NodeMemo = field(init=False, repr=False, compare=False)
    """The tables of ``memo`` under those keys, by node: fetched once per request."""
    ends: datetime | None = field(init=False, repr=False, compare=False)
    """When the pod's time limit ends if it starts now (None: no limit), which the
    maintenance filter compares with every draining node's time."""
    drains: dict[datetime, Verdict] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    """The maintenance verdict by drain time, for this request: nodes of one
    maintenance window share it, reason text and all."""

    def __post_init__(self) -> None:
        memo = self.memo
        if memo.config is not self.config:
            raise ValueError("a decision cache answers only for the config it was made for")
        d = self.demand
        tables = memo.shape_tables(d)
        object.__setattr__(self, "shape", tables.shape)
        object.__setattr__(self, "fit_shape", tables.fit_shape)
        object.__setattr__(self, "score_shape", tables.score_shape)
        object.__setattr__(self, "verdicts", tables.verdicts)
        object.__setattr__(self, "fits", tables.fits)
        object.__setattr__(self, "scores", tables.scores)
        limit = d.time_limit_s
        ends = None if limit is None else self.now + timedelta(seconds=limit)
        object.__setattr__(self, "ends", ends)
