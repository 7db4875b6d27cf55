"""RFC 6902 JSON Patch between two JSON documents, and its application.

Layer: PURE. Plain functions over JSON values (dicts, lists, str, int, float, bool, None):
no I/O, no clock, no aiohttp. The webhook mutates a copy of the object and answers with
``diff(original, mutated)``; tests and the load test check the answer with
``apply_patch``.

How the diff is built (every choice keeps the patch valid against the original):

* Maps are compared key by key. A key only in the original is removed, a key only in the
  mutated object is added with its whole value, so a missing parent map
  (``metadata.labels``) is created by one ``add`` that carries its children.
* Lists of equal length are compared element by element. A list that only grew at its
  end (a toleration, a scheduling gate appended) gets one ``add`` per new index, in
  order. Any other change of length replaces the whole list: a patch that reads as what
  the list became, rather than a puzzle of shifted elements.
* Scalars are compared with their JSON type: ``1``, ``1.0`` and ``true`` differ, as they
  do on the wire (Python's ``==`` says they are equal).
* Pointer tokens escape ``~`` as ``~0`` and ``/`` as ``~1`` (RFC 6901), e.g. the label
  ``tessera.dev/gang`` is ``/metadata/labels/tessera.dev~1gang``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

JsonPatch = list[dict[str, Any]]
"""A list of RFC 6902 operations: ``{"op", "path", "value"?, "from"?}``."""

PathToken = str | int


class PatchError(ValueError):
    """A patch that cannot be applied to the document: the message names the operation."""


def escape(token: PathToken) -> str:
    """One RFC 6901 reference token: ``~`` → ``~0`` first, then ``/`` → ``~1``."""
    return str(token).replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(path: Iterable[PathToken]) -> str:
    """The JSON pointer of ``path``: ``("metadata", "a/b")`` → ``/metadata/a~1b``."""
    return "".join("/" + escape(token) for token in path)


def parse_pointer(ptr: str) -> list[str]:
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError(f"JSON pointer {ptr!r} must be empty or start with '/'")
    return [unescape(token) for token in ptr[1:].split("/")]


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (orjson round trip: several times faster than deepcopy)."""
    return orjson.loads(orjson.dumps(value))


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: same type at every level, not just ``==`` (where ``1 == True``)."""
    if a is b:
        return True
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        # ``==`` is a fast C walk; the sorted encoding then rules out 1 vs true vs 1.0.
        return bool(a == b) and orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            b, option=orjson.OPT_SORT_KEYS
        )
    return type(a) is type(b) and bool(a == b)


def diff(original: Any, mutated: Any) -> JsonPatch:
    """The operations that turn ``original`` into ``mutated``; empty when they are equal.

    The operations' values are parts of ``mutated``, not copies (the webhook encodes the
    patch at once): copy before changing either.
    """
    ops: JsonPatch = []
    if type(original) is dict and type(mutated) is dict and original is not mutated:
        _diff_maps(original, mutated, "", ops)  # an admission's object: straight to its keys
    else:
        _diff(original, mutated, "", ops)
    return ops


_MISSING: Any = object()


def _token(key: str) -> str:
    # Most keys need no escaping; checking spares a call and two replaces per level.
    return key if "~" not in key and "/" not in key else escape(key)


def _diff(a: Any, b: Any, path: str, ops: JsonPatch) -> None:
    if a is b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        _diff_maps(a, b, path, ops)
        return
    if isinstance(a, list) and isinstance(b, list):
        if _diff_lists(a, b, path, ops):
            return
    elif _same(a, b):
        return
    ops.append({"op": "replace", "path": path, "value": b})


def _diff_maps(a: dict[str, Any], b: dict[str, Any], path: str, ops: JsonPatch) -> None:
    if not a.keys() <= b.keys():
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": f"{path}/{_token(key)}"})
    for key, value in b.items():
        old = a.get(key, _MISSING)
        if old is value:
            continue  # shared with the original (see Draft): unchanged
        if old is _MISSING:
            ops.append({"op": "add", "path": f"{path}/{_token(key)}", "value": value})
        elif type(old) is dict and type(value) is dict:
            _diff_maps(old, value, f"{path}/{_token(key)}", ops)  # the common case, direct
        else:
            _diff(old, value, f"{path}/{_token(key)}", ops)


def _diff_lists(a: list[Any], b: list[Any], path: str, ops: JsonPatch) -> bool:
    """Patch a list element by element, or by adds at its end; False when only a
    ``replace`` of the whole list says what it became."""
    if len(a) == len(b):
        for index, (old, new) in enumerate(zip(a, b, strict=True)):
            _diff(old, new, f"{path}/{index}", ops)
        return True
    if len(b) > len(a) and all(_same(old, new) for old, new in zip(a, b, strict=False)):
        for index in range(len(a), len(b)):
            ops.append({"op": "add", "path": f"{path}/{index}", "value": b[index]})
        return True
    return False


# ---------------------------------------------------------------- copy-on-write edits


class Draft:
    """An edit of a JSON object that copies only what it changes.

    ``root`` starts as a shallow copy of the original; ``node(path)`` copies each map or
    list on the way down the first time it is reached, so that a write never touches the
    original and everything not written stays shared with it. That sharing is what
    makes ``diff(original, draft.root)`` cheap: a subtree that is the very same object on
    both sides is skipped without a look inside. Mutable by design, and meant to live for
    one admission decision. Write leaves (a label, a list made anew) into the maps that
    ``node`` returns; a value assigned that way is not walked into again.
    """

    __slots__ = ("_copied", "root")

    def __init__(self, original: Mapping[str, Any]) -> None:
        self.root: dict[str, Any] = dict(original)
        # Every container this draft made, by path: the ones it may write into.
        self._copied: dict[tuple[PathToken, ...], Any] = {(): self.root}

    def node(self, path: Sequence[PathToken]) -> dict[str, Any]:
        """The map at ``path``, ours to write: copied on the way, missing or null maps created."""
        node = self._container(tuple(path))
        if type(node) is not dict:
            raise PatchError(f"{pointer(path)} is not an object")
        return node

    def _container(self, path: tuple[PathToken, ...]) -> Any:
        found = self._copied.get(path)
        if found is not None:
            return found
        parent = self._container(path[:-1])
        key: Any = path[-1]
        if type(parent) is list:
            if type(key) is str and key.isdecimal():
                key = int(key)
            # a list where a map was expected: the user's object has the wrong shape
            if type(key) is not int or not 0 <= key < len(parent):
                raise PatchError(f"{pointer(path[:-1])} is a list, not an object")
            child = parent[key]
        elif type(parent) is dict:
            child = parent.get(key)
        else:
            raise PatchError(f"{pointer(path[:-1])} is not an object or a list")
        if child is None:
            child = {}
        elif isinstance(child, dict | list):
            child = type(child)(child)
        else:
            raise PatchError(f"{pointer(path)} is a {type(child).__name__}, not an object")
        parent[key] = child
        self._copied[path] = child
        return child

    def get(self, path: Sequence[PathToken]) -> Any:
        """The value at ``path`` (``None`` when absent), for reading only."""
        node: Any = self.root
        for token in path:
            if type(node) is dict:
                node = node.get(token)
            elif type(node) is list and type(token) is int and token < len(node):
                node = node[token]
            else:
                return None
        return node

    def set_default(self, path: Sequence[PathToken], key: str, value: Any) -> bool:
        """Set ``key`` in the map at ``path`` unless it has a value; True when written."""
        node = self.get(path)
        if type(node) is dict and node.get(key) is not None:
            return False
        self.node(path)[key] = value
        return True


# ---------------------------------------------------------------- application


def apply_patch(document: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """Apply RFC 6902 ``ops`` to a copy of ``document`` and return it.

    Supports ``add``, ``remove``, ``replace``, ``move``, ``copy`` and ``test``; the input
    is never changed. Raises ``PatchError`` naming the failing operation.
    """
    doc = clone(document)
    for number, op in enumerate(ops):
        try:
            doc = _apply_one(doc, op)
        except PatchError as exc:
            raise PatchError(f"operation {number} {dict(op)!r}: {exc}") from None
    return doc


def _apply_one(doc: Any, op: Mapping[str, Any]) -> Any:
    kind = op.get("op")
    path = op.get("path")
    if not isinstance(path, str):
        raise PatchError("'path' must be a string")
    if kind == "add":
        return _add(doc, parse_pointer(path), clone(_value(op)))
    if kind == "remove":
        doc, _ = _remove(doc, parse_pointer(path))
        return doc
    if kind == "replace":
        doc, _ = _remove(doc, parse_pointer(path))
        return _add(doc, parse_pointer(path), clone(_value(op)))
    if kind in ("move", "copy"):
        source = op.get("from")
        if not isinstance(source, str):
            raise PatchError("'from' must be a string")
        if kind == "move":
            if path.startswith(source + "/"):
                raise PatchError("cannot move a value into one of its children")
            doc, value = _remove(doc, parse_pointer(source))
        else:
            value = clone(_get(doc, parse_pointer(source)))
        return _add(doc, parse_pointer(path), value)
    if kind == "test":
        if not _same(_get(doc, parse_pointer(path)), _value(op)):
            raise PatchError("test failed: value differs")
        return doc
    raise PatchError(f"unknown op {kind!r}")


def _value(op: Mapping[str, Any]) -> Any:
    if "value" not in op:
        raise PatchError("missing 'value'")
    return op["value"]


def _list_index(container: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(container)
    if not part.isdigit() or (len(part) > 1 and part[0] == "0"):
        raise PatchError(f"{part!r} is not an array index")
    index = int(part)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise PatchError(f"index {index} is out of range (length {len(container)})")
    return index


def _get(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"no member {token!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"cannot descend into a scalar at {token!r}")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, last, allow_end=True), value)
    else:
        raise PatchError("the parent of the target is not a container")
    return doc


def _remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    if not tokens:
        return None, doc
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"no member {last!r} to remove")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_list_index(parent, last, allow_end=False))
    raise PatchError("the parent of the target is not a container")
