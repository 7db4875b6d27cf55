"""Hostile request bodies, made from the real wire shapes.

Layer: PURE (test support; its one I/O: reading the golden and captured requests once).
Every body starts from a request a real kube-apiserver or kube-scheduler sent
(``../shared/captures``) or a golden request built from one (``tests/golden``), and is
then damaged: fields dropped or given the wrong type, unicode and control characters,
strings of megabytes, JSON nested thousands of levels deep, keys given twice, quantities
that are negative, NaN, infinite or beyond any unit, and finally, sometimes, the bytes
themselves cut short or spoiled. A few bodies are not JSON at all.

orjson writes at most 254 levels of nesting, so deep values are spliced into the encoded
text in place of a marker string; a duplicated key likewise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from hypothesis import strategies as st

from cluster import jsonio

ROOT: Final = Path(__file__).resolve().parents[2]
GOLDEN: Final = ROOT / "tests" / "golden"
CAPTURES: Final = ROOT.parent / "shared" / "captures"

Json = Any
PathKey = tuple[str | int, ...]


# ---------------------------------------------------------------- the real shapes


def golden_bodies(folder: str, *, paths: Sequence[str] = ()) -> dict[str, Json]:
    """The JSON bodies of ``tests/golden/<folder>``, by case (for the extender, only
    those POSTed to one of ``paths``)."""
    found: dict[str, Json] = {}
    for path in sorted((GOLDEN / folder).glob("*.request.json")):
        request = jsonio.loads(path.read_bytes())
        case = path.name.removesuffix(".request.json")
        if folder == "webhook":
            if "rawBody" not in request:
                found[case] = request
        elif request.get("path") in paths and "body" in request:
            found[case] = request["body"]
    return found


def captured_bodies(kind: str) -> dict[str, Json]:
    """The captured requests whose file name holds ``kind`` (``webhook-mutate``,
    ``ext-cache-filter``…), or none when the shared folder is not beside the repo."""
    if not CAPTURES.is_dir():
        return {}
    return {
        path.name: jsonio.loads(path.read_bytes())["body"]
        for path in sorted(CAPTURES.glob(f"*-{kind}-request.json"))
    }


# ---------------------------------------------------------------- hostile values

QUANTITIES: Final = (
    "-1", "-8", "NaN", "nan", "Inf", "+Inf", "-Inf", "inf", "Infinity", "1e308", "1e309",
    "-1e308", "999999999999Ei", "1Ei", "1e-9", "1n", "0.5", "1.5", "800m", "0", "-0", "+8",
    "8e0", "8E0", "0x8", "8 ", " 8", "8\n", "\u0668", "\uff18", "8\u00a0", "", "1/2", "8Gi",
    "8ki", "9" * 64, "9" * 5000, "1" + "0" * 400,
)  # fmt: skip
"""Quantity texts, valid and not: Kubernetes' grammar (``resource.Quantity``) allows
signs, exponents and suffixes, so a parser has many edges."""

NUMBERS: Final = (
    -1, -(2**63), 2**63 - 1, 2**64 - 1, 0, 1e308, -1e308, 1e-300, 0.5, -0.0, 1.5, 8.0, 1e19,
)  # fmt: skip
"""Numbers as orjson holds them: integers past 64 bits are read as floats (``1e19``)."""

_TEXT: Final = st.text(
    # lone surrogates are not UTF-8: no client can send them (orjson refuses them too)
    alphabet=st.characters(codec="utf-8"),
    max_size=40,
)
_CONTROL: Final = st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=8)
_HUGE_TEXT: Final = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["x", "é", "\u202e", "\x00", "\U0001f600", "\\", '"']),
    st.sampled_from([4096, 65_536, 300_000, 1_100_000]),
)

scalars: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NUMBERS),
    st.sampled_from(QUANTITIES),
    _TEXT,
    _CONTROL,
)
"""One JSON value of any type but a container (NaN and infinities are not JSON)."""

values: Final = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=10,
)
"""A JSON value of any shape, a few levels deep at most."""

DEPTHS: Final = (100, 253, 254, 255, 256, 600, 999, 1000, 1023, 1024, 1025, 10_000)
"""Levels of nesting: around orjson's limits (254 written, 1024 read) and Python's
recursion limit (1000), and far past them."""


def nested(depth: int, *, in_lists: bool) -> bytes:
    """``depth`` levels of arrays or objects around a number, as JSON text."""
    if in_lists:
        return b"[" * depth + b"1" + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


# ---------------------------------------------------------------- damage to a document


def paths_of(doc: Json, prefix: PathKey = ()) -> Iterator[PathKey]:
    """Every place in ``doc``: each key of each object and each item of each array."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from paths_of(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield (*prefix, index)
            yield from paths_of(value, (*prefix, index))


def _parent(doc: Json, path: PathKey) -> Json:
    """The container that holds ``path``'s last step, or ``None`` if it is gone."""
    node = doc
    for step in path[:-1]:
        if not _holds(node, step):
            return None
        node = node[step]
    return node


def _holds(node: Json, step: str | int) -> bool:
    if isinstance(node, dict):
        return isinstance(step, str) and step in node
    return isinstance(node, list) and isinstance(step, int) and step < len(node)


class Marks:
    """Splices made into the encoded text: a marker string stands for each."""

    def __init__(self) -> None:
        self.splices: dict[bytes, bytes] = {}

    def mark(self, text: bytes) -> str:
        marker = f"\u2063fuzz-mark-{len(self.splices)}\u2063"
        self.splices[jsonio.dumps(marker)] = text
        return marker

    def encode(self, doc: Json) -> bytes:
        body = jsonio.dumps(doc)
        for marker, text in self.splices.items():
            body = body.replace(marker, text)
        return body


Mutation = Callable[[Json, Marks], None]


@st.composite
def _mutation(draw: st.DrawFn, paths: Sequence[PathKey]) -> Mutation:
    path = draw(st.sampled_from(paths))
    kind = draw(
        st.sampled_from(["drop", "replace", "replace", "deep", "unknown", "duplicate", "wrap"])
    )
    value = draw(values) if kind in ("replace", "unknown", "duplicate") else None
    extra = draw(st.one_of(_TEXT, _HUGE_TEXT)) if kind == "unknown" else ""
    depth = draw(st.sampled_from(DEPTHS)) if kind == "deep" else 0
    in_lists = draw(st.booleans())

    def apply(doc: Json, marks: Marks) -> None:
        parent = _parent(doc, path)
        step = path[-1]
        if not _holds(parent, step):
            return  # an earlier mutation removed it
        if kind == "drop":
            del parent[step]
        elif kind == "replace":
            parent[step] = value
        elif kind == "deep":
            parent[step] = marks.mark(nested(depth, in_lists=in_lists))
        elif kind == "wrap":
            parent[step] = [parent[step]] if in_lists else {"value": parent[step]}
        elif kind == "unknown" and isinstance(parent, dict):
            parent[extra or "x"] = value
        elif kind == "duplicate" and isinstance(parent, dict) and isinstance(step, str):
            # the same key again, after the first: JSON allows it, the last one wins
            again = marks.mark(jsonio.dumps(step))
            parent[again] = value
            marks.splices[jsonio.dumps(again)] = jsonio.dumps(step)

    return apply


@st.composite
def _spoiled(draw: st.DrawFn, body: bytes) -> bytes:
    """The bytes as sent: mostly as encoded, else cut short or damaged."""
    how = draw(st.sampled_from(["as-is"] * 15 + ["cut", "byte", "bom", "trail", "utf16"]))
    if how == "cut" and body:
        return body[: draw(st.integers(0, len(body) - 1))]
    if how == "byte" and body:
        at = draw(st.integers(0, len(body) - 1))
        return body[:at] + draw(st.binary(min_size=1, max_size=3)) + body[at + 1 :]
    if how == "bom":
        return b"\xef\xbb\xbf" + body
    if how == "trail":
        return body + draw(st.sampled_from([b"}", b"]", b",", b" x", b"\x00", b"{}"]))
    if how == "utf16":
        return body.decode("utf-8", "replace").encode("utf-16")
    return body


def damaged(
    bases: Mapping[str, Json],
    *,
    max_mutations: int = 4,
    then: Callable[[st.DrawFn, Json], None] | None = None,
) -> st.SearchStrategy[bytes]:
    """One of ``bases``, damaged by one to ``max_mutations`` mutations at places drawn
    from its own paths, encoded, and maybe spoiled as bytes. ``then`` may adjust the
    damaged document before it is encoded."""
    names = sorted(bases)
    places = {name: list(paths_of(bases[name])) for name in names}

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        name = draw(st.sampled_from(names))
        doc = copy.deepcopy(bases[name])
        marks = Marks()
        if places[name]:
            for mutate in draw(
                st.lists(_mutation(places[name]), min_size=1, max_size=max_mutations)
            ):
                mutate(doc, marks)
        if then is not None:
            then(draw, doc)
        return draw(_spoiled(marks.encode(doc)))

    return build()


# ---------------------------------------------------------------- bodies that are not the shape


def _many_keys(n: int) -> bytes:
    return b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(n)) + b"}"


RAW: Final = (
    b"", b" ", b"null", b"true", b"0", b"-1", b"1e400", b"NaN", b"Infinity", b'"text"', b"[]",
    b"{}", b"[{}]", b"{" * 10_000, b"[" * 10_000, nested(10_000, in_lists=True),
    nested(10_000, in_lists=False), nested(1024, in_lists=True), nested(1025, in_lists=False),
    b"\xff\xfe\x00{", b"\x00" * 1000, b"{\"a\":\"\xed\xa0\x80\"}", b"{\"a\":\"\\ud800\"}",
    b'{"a":123456789012345678901234567890}', b'{"a":-1e400}', b"{'a': 1}", b"{a: 1}",
    b'{"a":1,}', b"[1,2", b"\xef\xbb\xbf{}", b" " * 2_000_000 + b"{}",
    b"[" + b"0," * 500_000 + b"0]", _many_keys(100_000), b'{"a":"' + b"x" * 2_500_000 + b'"}',
)  # fmt: skip
"""Bodies no client should send: empty, scalars, broken JSON, deep JSON, invalid UTF-8,
megabytes of nothing much."""

not_json: Final = st.one_of(
    st.sampled_from(RAW),
    st.binary(max_size=512),
    _TEXT.map(lambda text: text.encode()),
    values.map(jsonio.dumps),
)
