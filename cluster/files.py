"""Kubernetes objects from a file instead of the API (standalone mode, demo, load test).

Layer: I/O (reads files). Turns bytes into plain dicts shaped like the API's JSON, the
same dicts ``cluster.convert`` reads from a watch; it does not convert them, watch the
file, or talk to the API server.

Accepted: a multi-document YAML file (what an admin would ``kubectl apply``), a JSON
file, and any ``List`` among their documents (``kind: List`` from ``kubectl get
nodes,pods -A -o yaml``, or a typed ``NodeList``/``PodList`` from the API, whose items
get their ``kind`` and ``apiVersion`` filled in). Empty documents are skipped. Errors
name the file and the document (counted from 1).

YAML timestamps stay strings, as in the API's JSON: an unquoted
``tessera.dev/drain-after: 2026-12-01T02:00:00Z`` must reach ``cluster.convert`` as text.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import yaml

from cluster import jsonio

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# libyaml's loader is several times faster than the pure-Python one, which matters for
# a file of 150,000 pods; the pure loader is the fallback where libyaml is missing.
_FastSafeLoader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_FastSafeLoader):  # type: ignore[misc]
    """The safe loader without YAML 1.1's implicit timestamps (Kubernetes has none)."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in _FastSafeLoader.yaml_implicit_resolvers.items()
    }


class ObjectFileError(ValueError):
    """A file that does not hold Kubernetes objects; the message names file and document."""


def load_objects(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every object in a YAML or JSON file, lists flattened into their items."""
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise ObjectFileError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    return load_objects_from_bytes(data, name)


def load_objects_from_bytes(data: bytes, name: str) -> list[dict[str, Any]]:
    """Like ``load_objects`` for bytes in memory; ``name`` is what errors call them."""
    with _collector_paused():
        return _load(data, name)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing allocates millions of containers and no cycles; each allocation burst would
    trigger the cyclic collector over everything built so far (a 150,000-pod JSON file
    parses in 1.2 s with it paused, 4 s without). Restored on the way out."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(data: bytes, name: str) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for number, document in _documents(data, name):
        where = f"{name}: document {number}"
        if isinstance(document, list):
            # a top-level sequence ([{...}, {...}]) holds one object per element
            for item_number, item in enumerate(document, start=1):
                _flatten(item, f"{where}, item {item_number}", objects)
        elif document is not None:
            _flatten(document, where, objects)
    return objects


def _documents(data: bytes, name: str) -> Iterator[tuple[int, Any]]:
    if name.endswith(".json") or data.lstrip()[:1] in (b"{", b"["):
        try:
            yield 1, jsonio.loads(data)
            return
        except jsonio.JsonError as exc:
            if name.endswith(".json"):
                raise ObjectFileError(f"{name}: {exc}") from None
            # not one JSON value (a YAML flow mapping, or several documents): YAML reads it
    number = 0
    try:
        for document in yaml.load_all(data, Loader=_Loader):
            number += 1
            yield number, document
    except yaml.YAMLError as exc:
        raise ObjectFileError(f"{name}: document {number + 1}: {_yaml_reason(exc)}") from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"not valid YAML: {problem}"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _flatten(obj: Any, where: str, out: list[dict[str, Any]]) -> None:
    if not isinstance(obj, dict):
        raise ObjectFileError(f"{where}: expected a Kubernetes object, got {_describe(obj)}")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ObjectFileError(f"{where}: the object has no kind")
    items = obj.get("items", ())
    if kind.endswith("List") and isinstance(items, list | None):
        item_kind = kind.removesuffix("List")
        api_version = obj.get("apiVersion")
        for number, item in enumerate(items or (), start=1):
            if item_kind and isinstance(item, dict):
                # the API leaves kind and apiVersion off the items of a typed list
                item.setdefault("kind", item_kind)
                if api_version is not None:
                    item.setdefault("apiVersion", api_version)
            _flatten(item, f"{where}, item {number}", out)
        return
    out.append(obj)


def _describe(value: Any) -> str:
    text = repr(value)
    short = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {short}"
