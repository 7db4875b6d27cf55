"""A server's hot routes as plain functions of a request's bytes, answered on the
connection itself or through aiohttp.

Layer: I/O types and framing (no sockets of its own). Must not decide anything about a
request's content, read a clock or hold state: a ``Route`` is the server's handler, and
``server.guard`` (for the requests it frames strictly) or ``server.serving.add_route``
(for every other request, through aiohttp) calls it.

Why: the webhook's ``/mutate`` and the extender's verbs are what their clients wait on,
hundreds of times a second. Through aiohttp each one builds a request object, a task, a
middleware chain, a response object and its headers, which together cost more than a
review decided from a kept answer (``loadtest bench-webhook``). The guard already reads
every request head strictly and knows where each body ends; for a ``POST`` to one of
these paths whose head it frames (``server.httphead``: one ``Content-Length``, no
transfer or content coding) it collects the body itself, calls the route and writes
its ``Reply`` as one HTTP/1.1 response. Whatever it does not frame so still reaches the
same route through aiohttp, with the same answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final
from urllib.parse import parse_qsl

from cluster import jsonio
from server.deadline import Deadline

JSON: Final = "application/json"


@dataclass(frozen=True, slots=True)
class Call:
    """One request to a route: what its handler may read of it."""

    method: str
    path: str
    query: str
    """The target's query, undecoded (``timeout=10s``)."""
    body: bytes
    deadline: Deadline | None
    """From the first byte of the request's head (``server.guard``); ``None``: none."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    close: bool = False
    """The connection cannot carry another request after this one (its body was not
    read to the end)."""


Route = Callable[[Call], Awaitable[Reply]]
"""A server's handler of one path: never raises for anything a client can send. Its
body has been read when it is called, so it checks the deadline first
(``ConnectionGuard.late``), and counts what it answered in its own metrics."""


def status_body(code: int, reason: str, message: str) -> bytes:
    """A Kubernetes ``Status`` (``metav1.Status``): what client-go decodes an error from."""
    return jsonio.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


def response_bytes(reply: Reply, *, keep_alive: bool) -> bytes:
    """``reply`` as an HTTP/1.1 response, ``Connection: close`` unless ``keep_alive``."""
    try:
        phrase = HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = "Unknown"
    closing = b"" if keep_alive and not reply.close else b"Connection: close\r\n"
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        reply.status,
        phrase.encode(),
        reply.content_type.encode(),
        len(reply.body),
        closing,
    )
    return head + reply.body


def query_value(query: str, name: str) -> str | None:
    """The first value of ``name`` in an undecoded query, percent-decoded."""
    if name not in query:
        return None
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == name:
            return value
    return None
