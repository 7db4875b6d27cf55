"""Answers to CREATE reviews, remembered per policy for objects that differ only in name.

Layer: PURE. Plain data and functions: no I/O, no clock, no aiohttp, no pydantic. Must
not decide anything itself: what it keeps is what ``webhook.admit.decide`` and
``webhook.patch.diff`` answered, and it answers only where they would answer the same.

Jobs are created from templates: a CI pipeline or a sweep sends the same Job again and
again, with a new name (or a ``generateName``) each time. The ten rules read the object
and the policy, and of the object's identity only the name, for two things: the gang id
(``<namespace>.<name>``, or a suffix drawn from the request uid) and the messages of
denials. So an object whose content, identity left out, is one seen before under the
same policy and settings gets the same patch and warnings, with its own gang id.

* The key (``answer_key``): the kind and namespace the request declares, the settings,
  and a 256-bit BLAKE2b digest of the object encoded with ``metadata``'s identity fields
  left out (name, generateName, uid, resourceVersion, creationTimestamp, generation,
  managedFields, selfLink): objects can be megabytes, and the memo holds many. Anything
  else the object carries, read by a rule or not, is in it: a different object is a
  different key (a collision of 256-bit digests is out of reach), so a kept answer is
  never wrong, only unused.
* The gang id: the rules leave it out and say which label maps it goes into
  (``webhook.rules.gang.rule_gang``); it is written as the last step (``name_gang``), and
  where it lands in the patch (``gang_holes``: the operation whose path leads to the
  label, and the path inside its value) is where each later request's own id is filled
  in when the answer is given.
* Denials are not kept: their messages name the object. Nor are UPDATE reviews, whose
  answer reads the stored object too.

The memo lives on the ``Policy`` it was computed under (``Policy.answers``), so a policy
change starts afresh; it holds at most ``ANSWERS_KEPT`` answers, each with a patch of at
most ``ANSWER_PATCH_BYTES_KEPT``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import jsonio, labels
from webhook.patch import JsonPatch, PathToken, pointer

ANSWERS_KEPT: Final = 1024
"""Answers a policy keeps before it starts over: distinct Job templates in use."""
ANSWER_PATCH_BYTES_KEPT: Final = 8 * 1024
"""Largest patch, written as JSON, of an answer kept: four times the largest the golden
cases show (2 KB, a flavor affinity merged with the user's). A patch can repeat what the
user wrote; with the key a digest, this bounds the memo at about 40 MB."""

IDENTITY_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
    }
)
"""What of ``metadata`` names one object rather than describing it."""

Hole = tuple[int, tuple[PathToken, ...]]
"""Where the gang id goes: the operation's index, and the path inside its value."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An allowed CREATE's answer, and where in it the gang id goes."""

    patch: JsonPatch
    """Never changed once kept: ``fill`` copies what it writes into."""
    holes: tuple[Hole, ...]
    """Where ``patch`` holds the id of the request it was made for (``gang_holes``)."""
    warnings: tuple[str, ...]
    decision: str
    reason: str
    queue: str

    def fill(self, gang_id: str) -> JsonPatch:
        """The patch for a request whose gang id is ``gang_id``."""
        if not self.holes:
            return self.patch
        patch = list(self.patch)
        for index, path in self.holes:
            op = dict(patch[index])
            op["value"] = _set_in(op["value"], path, gang_id)
            patch[index] = op
        return patch


def answer_key(
    kind: tuple[str, str, str], namespace: str, obj: Mapping[str, Any], settings: object
) -> tuple[object, ...]:
    """The memo key of a CREATE review of ``obj`` (see the module's docstring);
    ``jsonio.JsonEncodeError`` for an object nested deeper than
    ``jsonio.WRITE_DEPTH_LIMIT``, which the caller refuses."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping) and not IDENTITY_FIELDS.isdisjoint(metadata):
        described = {k: v for k, v in metadata.items() if k not in IDENTITY_FIELDS}
        obj = {**obj, "metadata": described}
    # an object may be as large as kube-apiserver allows (1.5 MiB): keep a digest of it
    digest = hashlib.blake2b(jsonio.dumps(obj), digest_size=32).digest()
    return (kind, namespace, settings, digest)


def gang_holes(patch: JsonPatch, slots: Iterable[Sequence[PathToken]]) -> tuple[Hole, ...] | None:
    """Where the gang label of each label map in ``slots`` (paths in the object) sits in
    ``patch``, made after the id was written there; ``None`` if one is not in it."""
    holes = []
    for slot in slots:
        target = (*slot, labels.GANG)
        wanted = pointer(target)
        for index, op in enumerate(patch):
            path = op["path"]
            if wanted == path or wanted.startswith(path + "/"):
                # a pointer has one "/" per token: the rest of the target is in the value
                holes.append((index, target[path.count("/") :]))
                break
        else:
            return None
    return tuple(holes)


def keep(
    memo: dict[tuple[object, ...], Answer],
    key: tuple[object, ...],
    patch: JsonPatch,
    holes: tuple[Hole, ...],
    *,
    patch_bytes: int,
    warnings: Sequence[str],
    decision: str,
    reason: str,
    queue: str,
) -> None:
    """Remember an allowed answer, whose gang id (if it has one) is at ``holes``, unless
    its patch, ``patch_bytes`` long written as JSON, is larger than
    ``ANSWER_PATCH_BYTES_KEPT``."""
    if patch_bytes > ANSWER_PATCH_BYTES_KEPT:
        return
    if len(memo) >= ANSWERS_KEPT:
        memo.clear()
    memo[key] = Answer(patch, holes, tuple(warnings), decision, reason, queue)


def _set_in(value: Any, path: tuple[str | int, ...], gang_id: str) -> Any:
    """``value`` with ``gang_id`` at ``path``, copying the containers on the way."""
    if not path:
        return gang_id
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _set_in(value[head], rest, gang_id)
    return copy
