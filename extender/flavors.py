"""Kueue's ResourceFlavors as the extender's metrics need them: name → ``nodeLabels``.

Layer: I/O (an informer feeds it; a cluster file may too). Only the capacity metrics read
it, to label GPUs by flavor: no decision reads it, and its watch is not one of the
cache's (``/readyz`` and ``--max-cache-age`` do not wait for it), so a cluster without
Kueue loses the flavor label and nothing else. Must not hold more than each flavor's
name and node labels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

from cluster import logs
from cluster.informer import Informer, ListWatchClient

log = logging.getLogger(__name__)

FLAVORS_PATH: Final = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"


def _node_labels(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, str]] | None:
    meta = obj.get("metadata")
    spec = obj.get("spec")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    raw = spec.get("nodeLabels") if isinstance(spec, Mapping) else None
    if raw is not None and not isinstance(raw, Mapping):
        log.warning("ResourceFlavor nodeLabels ignored", extra=logs.fields(flavor=name))
        raw = None
    labels = {k: v for k, v in (raw or {}).items() if isinstance(k, str) and isinstance(v, str)}
    return name, MappingProxyType(labels)


class Flavors:
    """The flavors seen last, as one read-only table that a change replaces whole (a
    reader keeps the table it took)."""

    def __init__(self) -> None:
        self._table: Mapping[str, Mapping[str, str]] = MappingProxyType({})

    def table(self) -> Mapping[str, Mapping[str, str]]:
        return self._table

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        parsed = (_node_labels(obj) for obj in items)
        self._table = MappingProxyType(dict(p for p in parsed if p is not None))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        found = _node_labels(obj)
        if found is None:
            return
        table = dict(self._table)
        if kind == "DELETED":
            table.pop(found[0], None)
        else:
            table[found[0]] = found[1]
        self._table = MappingProxyType(table)

    def informer(self, client: ListWatchClient, **options: Any) -> Informer:
        return Informer(
            client, FLAVORS_PATH, on_replace=self.replace, on_event=self.event, **options
        )
