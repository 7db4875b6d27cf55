"""Request heads read strictly: where the head ends and how long the body is, only for
the plain form that kube-apiserver and kube-scheduler send; anything else is left to the
server's own parser, unframed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.httphead import Head, HeadTooLarge, read_head

LIMIT = 8192

KUBE_APISERVER = (
    b"POST /mutate?timeout=5s HTTP/1.1\r\n"
    b"Host: tessera-webhook.tessera-system.svc:443\r\n"
    b"User-Agent: kube-apiserver-admission\r\n"
    b"Content-Length: 3664\r\n"
    b"Accept: application/json, */*\r\n"
    b"Content-Type: application/json\r\n"
    b"Accept-Encoding: gzip\r\n\r\n"
)


def test_kube_apiservers_review_is_framed() -> None:
    head = read_head(KUBE_APISERVER + b"{...", LIMIT)
    assert head == Head(
        size=len(KUBE_APISERVER),
        method="POST",
        target="/mutate?timeout=5s",
        body=3664,
        keep_alive=True,
        framed=True,
    )
    assert head.path == "/mutate"
    assert head.query == "timeout=5s"


def test_a_head_is_read_only_once_its_blank_line_has_come() -> None:
    for cut in range(len(KUBE_APISERVER)):
        assert read_head(KUBE_APISERVER[:cut], LIMIT) is None
    assert read_head(KUBE_APISERVER, LIMIT) is not None


def test_a_head_without_an_end_within_the_limit_is_too_large() -> None:
    with pytest.raises(HeadTooLarge):
        read_head(b"GET / HTTP/1.1\r\nX: " + b"a" * LIMIT, LIMIT)
    assert read_head(b"GET / HTTP/1.1\r\nX: " + b"a" * (LIMIT - 40), LIMIT) is None


@pytest.mark.parametrize(
    ("head", "body", "keep_alive"),
    [
        pytest.param(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", 0, True, id="probe"),
        pytest.param(b"POST /filter HTTP/1.1\r\ncontent-length:12\r\n\r\n", 12, True, id="case"),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length: 0 \r\n\r\n", 0, True, id="space"),
        pytest.param(b"POST /x HTTP/1.1\r\nConnection: close\r\n\r\n", 0, False, id="close"),
        pytest.param(
            b"POST /x HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n", 0, False, id="tokens"
        ),
    ],
)
def test_plain_heads_are_framed(head: bytes, body: int, keep_alive: bool) -> None:
    read = read_head(head, LIMIT)
    assert read is not None
    assert (read.framed, read.body, read.keep_alive, read.size) == (
        True,
        body,
        keep_alive,
        len(head),
    )


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", id="chunked"),
        pytest.param(
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            id="both",
        ),
        pytest.param(
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", id="twice"
        ),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length: +5\r\n\r\n", id="signed"),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", id="list"),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length : 5\r\n\r\n", id="space-before-colon"),
        pytest.param(b"POST /x HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", id="obs-fold"),
        pytest.param(b"POST /x HTTP/1.1\r\nX: a\nContent-Length: 5\r\n\r\n", id="bare-lf"),
        pytest.param(b"POST /x HTTP/1.1\r\nX: \xff\r\n\r\n", id="not-ascii"),
        pytest.param(b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", id="expect"),
        pytest.param(b"GET /x HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", id="upgrade"),
        pytest.param(b"GET /x HTTP/1.0\r\n\r\n", id="http-1.0"),
        pytest.param(b"\r\nGET /x HTTP/1.1\r\n\r\n", id="leading-blank-line"),
        pytest.param(b"GET  /x HTTP/1.1\r\n\r\n", id="two-spaces"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", id="tls-to-http"),
    ],
)
def test_anything_ambiguous_is_left_unframed(head: bytes) -> None:
    read = read_head(head, LIMIT)
    assert read is not None
    assert not read.framed
    assert read.size == len(head)


names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True).filter(
    lambda n: n.lower() not in {"content-length", "transfer-encoding", "expect", "upgrade"}
)
values = st.from_regex(r"[!-~]([ -~]{0,30}[!-~])?", fullmatch=True)


@given(
    st.lists(st.tuples(names, values), max_size=12),
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=0, max_value=12),
    st.binary(max_size=64),
)
def test_a_framed_request_ends_where_its_content_length_says(
    fields: list[tuple[str, str]], length: int, at: int, rest: bytes
) -> None:
    lines = [f"{name}: {value}" for name, value in fields]
    lines.insert(min(at, len(lines)), f"Content-Length: {length}")
    raw = ("POST /mutate?timeout=5s HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode()
    read = read_head(raw + rest, 1 << 16)
    assert read is not None
    assert read.framed
    assert (read.size, read.body, read.target) == (len(raw), length, "/mutate?timeout=5s")
