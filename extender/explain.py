"""Why a pod fits no node, in words a person reads once: reasons grouped, counted, named.

Layer: PURE. Functions and frozen records from the filter's reasons (node → text) to
grouped counts, and the JSON of ``GET /debug/reasons`` both ways: no I/O, no clock
(times arrive as values), no cache, no settings. The extender's shell
(``extender.reasons``) records what ``/filter`` decided and answers with these; the
console (``tessera why``) reads the same JSON back with ``record_from_json`` and words it
with ``headline``. Must not judge a node: the filters did, and their texts are kept as
they wrote them.

A filter's reason is free text written for people, one per refused node. Most texts do
not name the node (``filters`` words them per reason, not per node, so that
kube-scheduler's event counts them as one), so grouping identical texts turns 5,000
refused nodes into a handful of rows. ``reason_category`` names the filter a text comes
from, for the metrics' bounded label and the one-line headline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cluster.convert.grammar import AnnotationError, format_rfc3339, parse_rfc3339
from cluster.model import PodDemand

# Ordered: the first fragment found in a reason names its category. They follow the
# wording of extender.filters and extender.decide; an unknown wording counts as "other".
_REASON_FRAGMENTS: Final = (
    ("request is unusable: ", "unusable_request"),
    ("not in the extender's cache", "not_cached"),
    ("not a usable Node", "bad_node"),
    ("cordoned", "cordoned"),
    ("pod accepts", "product"),
    ("drains for maintenance", "maintenance"),
    ("is reserved for gang", "reserved"),
    ("requires topology level", "gang_level"),
    ("has room for", "gang_room"),
    ("; gang ", "gang_domain"),
    ("; the node is in another ", "gang_domain"),
    ("node has no GPUs", "no_gpus"),
    ("are unhealthy", "too_few_gpus"),
    ("node has ", "too_few_gpus"),
    ("free in island", "island"),
    ("are in use", "gpus_in_use"),
    ("milli-GPU free", "gpus_in_use"),
    (" free, pod needs", "gpus_in_use"),
)
REASON_CATEGORIES: Final = frozenset(c for _, c in _REASON_FRAGMENTS) | {"other"}

CATEGORY_WORDS: Final = {
    "unusable_request": "the pod's GPU request is unusable",
    "not_cached": "not in the extender's cache",
    "bad_node": "not a usable Node",
    "cordoned": "cordoned",
    "product": "another GPU product",
    "maintenance": "draining for maintenance",
    "reserved": "reserved for a waiting gang",
    "gang_level": "the gang's topology level is unknown",
    "gang_room": "in a {level} without room for the gang",
    "gang_domain": "outside the {level} of the gang's placed members",
    "no_gpus": "no GPUs",
    "too_few_gpus": "too few healthy GPUs",
    "island": "free GPUs split across NVLink islands",
    "gpus_in_use": "GPUs in use",
    "other": "other reasons",
}
"""Each category in a few words, for the headline (``{level}``: the gang's level)."""

REASON_CHARS: Final = 400
"""A reason text is cut to this many characters in a record: a product list a user
wrote (``tessera.dev/gpu-product``) is echoed in one, and a record must stay small."""
GROUPS_KEPT: Final = 16
"""Distinct reason texts kept per pod, the most frequent first; the rest are counted."""
EXAMPLES_KEPT: Final = 3
"""Nodes named per reason (and among those that fit)."""


def reason_category(reason: str) -> str:
    """The bounded label a filter reason is counted under."""
    for fragment, category in _REASON_FRAGMENTS:
        if fragment in reason:
            return category
    return "other"


# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class ReasonGroup:
    """The nodes one reason text refused: how many, whether evicting pods could help
    there (``resolvable``: kube-scheduler may try preemption), and a few of them."""

    reason: str
    category: str
    resolvable: bool
    nodes: int
    examples: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "category": self.category,
            "resolvable": self.resolvable,
            "nodes": self.nodes,
            "examples": list(self.examples),
        }


@dataclass(frozen=True, slots=True)
class Tallies:
    """Nodes per reason text of one ``/filter`` answer: those preemption may help
    (``failed``) and those it cannot (``unresolvable``). Counted once per request, for
    the metrics and the reasons kept alike."""

    failed: Mapping[str, int]
    unresolvable: Mapping[str, int]

    @classmethod
    def of(cls, failed: Mapping[Any, str], unresolvable: Mapping[Any, str]) -> Tallies:
        # 5,000 refused nodes carry a few distinct texts: counted at C speed
        return cls(Counter(failed.values()), Counter(unresolvable.values()))

    def by_reason(self) -> Iterable[tuple[str, int]]:
        yield from self.failed.items()
        yield from self.unresolvable.items()


def group_reasons(
    tallies: Tallies,
    *,
    keep: int = GROUPS_KEPT,
    refused: Sequence[Mapping[Any, str]] = (),
    examples: int = EXAMPLES_KEPT,
) -> tuple[tuple[ReasonGroup, ...], int, int]:
    """The ``keep`` most frequent reason texts (most nodes first, then the text), each
    with up to ``examples`` node names found in ``refused`` (the filter's node → reason
    maps; none given: no names), and (texts left out, nodes they refused)."""
    rows = [(text, count, False) for text, count in tallies.unresolvable.items()]
    rows += [(text, count, True) for text, count in tallies.failed.items()]
    rows.sort(key=lambda row: (-row[1], row[0], row[2]))
    kept, rest = rows[:keep], rows[keep:]
    named: dict[str, list[str]] = {text: [] for text, _, _ in kept}
    if refused and examples > 0:
        wanted = len(named)
        for reasons in refused:
            for node, text in reasons.items():
                found = named.get(text)
                if found is not None and len(found) < examples:
                    found.append(str(node))
                    if len(found) == examples:
                        wanted -= 1
                        if not wanted:
                            break
            if not wanted:
                break
    groups = tuple(
        ReasonGroup(
            reason=text[:REASON_CHARS],
            category=reason_category(text),
            resolvable=resolvable,
            nodes=count,
            examples=tuple(named[text]),
        )
        for text, count, resolvable in kept
    )
    return groups, len(rest), sum(count for _, count, _ in rest)


@dataclass(frozen=True, slots=True)
class BindNote:
    """The last ``/bind`` of the pod: where, when, and its ``Error`` (``""``: bound)."""

    at: datetime
    node: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class PodReasons:
    """What the extender last decided for one pod, as ``GET /debug/reasons`` shows it."""

    pod: str
    """``namespace/name``."""
    uid: str
    first_at: datetime
    """When its first ``/filter`` that is still remembered came."""
    at: datetime
    """When its last ``/filter`` came."""
    filters: int
    """``/filter`` requests for it since ``first_at``."""
    demand: Mapping[str, object]
    """What it asks for (``demand_json``)."""
    candidates: int
    fit: int
    fit_examples: tuple[str, ...]
    groups: tuple[ReasonGroup, ...]
    other_reasons: int = 0
    """Reason texts beyond ``groups``, and the nodes they refused."""
    other_nodes: int = 0
    examples_kept: bool = True
    """False once the node names of an older record were let go (only counts are left)."""
    bind: BindNote | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "pod": self.pod,
            "uid": self.uid,
            "first_filtered": format_rfc3339(self.first_at),
            "last_filtered": format_rfc3339(self.at),
            "filters": self.filters,
            "demand": dict(self.demand),
            "candidates": self.candidates,
            "fit": self.fit,
            "fit_examples": list(self.fit_examples),
            "reasons": [g.to_json() for g in self.groups],
            "other_reasons": {"reasons": self.other_reasons, "nodes": self.other_nodes},
            "examples_kept": self.examples_kept,
            "bind": None
            if self.bind is None
            else {
                "at": format_rfc3339(self.bind.at),
                "node": self.bind.node,
                "error": self.bind.error,
            },
        }


def demand_json(demand: PodDemand) -> dict[str, object]:
    """What a pod asks for, as a record shows it."""
    gang = demand.gang
    return {
        "gpus": demand.gpus,
        "gpu_milli": demand.gpu_milli,
        "products": list(demand.products),
        "gang": None if gang is None else gang.id,
        "gang_size": None if gang is None else gang.size,
        "gang_min": None if gang is None else gang.min_count,
        "topology": None if demand.topology is None else str(demand.topology),
        "time_limit_s": demand.time_limit_s,
    }


class RecordError(ValueError):
    """A ``/debug/reasons`` answer that is not what an extender writes."""


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecordError(f"{key!r} is {type(value).__name__}, not {kind}")
    return value


def _time(obj: Mapping[str, Any], key: str) -> datetime:
    try:
        return parse_rfc3339(_get(obj, key, str))
    except AnnotationError as exc:
        raise RecordError(f"{key!r}: {exc}") from None


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value[:EXAMPLES_KEPT] if isinstance(v, str))


def record_from_json(obj: object) -> PodReasons:
    """A record of ``GET /debug/reasons`` read back (``RecordError`` if it is none)."""
    if not isinstance(obj, Mapping):
        raise RecordError("a record is not an object")
    groups = []
    for raw in _get(obj, "reasons", list)[:GROUPS_KEPT]:
        if not isinstance(raw, Mapping):
            raise RecordError("a reason is not an object")
        text = _get(raw, "reason", str)[:REASON_CHARS]
        groups.append(
            ReasonGroup(
                reason=text,
                category=reason_category(text),
                resolvable=bool(raw.get("resolvable")),
                nodes=_get(raw, "nodes", int),
                examples=_names(raw.get("examples")),
            )
        )
    other = obj.get("other_reasons")
    other = other if isinstance(other, Mapping) else {}
    bind = obj.get("bind")
    note = None
    if isinstance(bind, Mapping):
        note = BindNote(
            _time(bind, "at"), str(bind.get("node") or ""), str(bind.get("error") or "")
        )
    demand = obj.get("demand")
    return PodReasons(
        pod=_get(obj, "pod", str),
        uid=str(obj.get("uid") or ""),
        first_at=_time(obj, "first_filtered"),
        at=_time(obj, "last_filtered"),
        filters=_get(obj, "filters", int),
        demand=dict(demand) if isinstance(demand, Mapping) else {},
        candidates=_get(obj, "candidates", int),
        fit=_get(obj, "fit", int),
        fit_examples=_names(obj.get("fit_examples")),
        groups=tuple(groups),
        other_reasons=int(other.get("reasons") or 0),
        other_nodes=int(other.get("nodes") or 0),
        examples_kept=bool(obj.get("examples_kept", True)),
        bind=note,
    )


# ---------------------------------------------------------------- words


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def demand_words(demand: Mapping[str, object]) -> str:
    """``needs 8 GPUs of H100, as one of gang team-nlp.llm (4 members, 4 together,
    required:rack)``: what a record's ``demand`` asks for, in one line."""
    gpus, milli = demand.get("gpus"), demand.get("gpu_milli")
    if isinstance(gpus, int) and gpus > 0:
        text = f"needs {_plural(gpus, 'GPU')}"
    elif isinstance(milli, int) and milli > 0:
        text = f"needs {milli} milli of one GPU"
    else:
        text = "needs no GPU"
    products = demand.get("products")
    if isinstance(products, list) and products:
        text += " of " + " or ".join(str(p) for p in products)
    gang = demand.get("gang")
    if isinstance(gang, str) and gang:
        size, least = demand.get("gang_size"), demand.get("gang_min")
        parts = [f"{size} members" if isinstance(size, int) else "", ""]
        if isinstance(least, int):
            parts[1] = f"{least} together"
        topology = demand.get("topology")
        if isinstance(topology, str) and topology:
            parts.append(topology)
        text += f", as one of gang {gang} ({', '.join(p for p in parts if p)})"
    limit = demand.get("time_limit_s")
    if isinstance(limit, int) and limit > 0:
        text += f", time limit {limit} s"
    return text


def _level(demand: Mapping[str, object]) -> str:
    topology = demand.get("topology")
    if isinstance(topology, str) and ":" in topology:
        return topology.split(":", 1)[1]
    return "domain"


def by_category(groups: Iterable[ReasonGroup]) -> list[tuple[str, int, bool]]:
    """(category, nodes, any resolvable) over ``groups``, the most nodes first."""
    nodes: Counter[str] = Counter()
    resolvable: set[str] = set()
    for group in groups:
        nodes[group.category] += group.nodes
        if group.resolvable:
            resolvable.add(group.category)
    ordered = sorted(nodes.items(), key=lambda item: (-item[1], item[0]))
    return [(category, count, category in resolvable) for category, count in ordered]


def headline(record: PodReasons) -> str:
    """One line: what the pod needs, how many nodes fit, and why the others do not,
    by kind of reason (``0 of 5000 nodes fit: 3000 in a rack without room for the gang;
    1900 GPUs in use (preemption may help); 60 too few healthy GPUs``)."""
    level = _level(record.demand)
    parts = []
    for category, count, resolvable in by_category(record.groups):
        words = CATEGORY_WORDS.get(category, category).format(level=level)
        parts.append(f"{count} {words}" + (" (preemption may help)" if resolvable else ""))
    if record.other_nodes:
        parts.append(f"{record.other_nodes} for {_plural(record.other_reasons, 'other reason')}")
    fit = f"{record.fit} of {record.candidates} nodes fit"
    return f"{demand_words(record.demand)}: {fit}" + (": " + "; ".join(parts) if parts else "")
