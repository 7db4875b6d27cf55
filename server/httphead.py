"""Where an HTTP/1.1 request's head ends and how long its body is, read strictly.

Layer: PURE. Bytes in, a ``Head`` out: no I/O, no clock, no aiohttp. ``server.guard``
reads each request's head with it before the server's own parser (aiohttp's llhttp) sees
the request, to time the head, to count the body against the buffer budget and, when the
server is overloaded, to answer at once without handing the request on.

Two parsers that disagree on where a request ends are how requests get smuggled, so only
the plain form is *framed* here: ``HTTP/1.1``, token header names, printable values, at
most one ``Content-Length`` of digits, and no ``Transfer-Encoding``, ``Expect`` or
``Upgrade``. On those the two parsers agree byte for byte (llhttp refuses the rest of
what could be ambiguous). Anything else is a head that is not ``framed``: the guard never
answers it itself, hands it to the server unread, and ends the connection after it.
kube-apiserver and kube-scheduler only send the plain form.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

END: Final = b"\r\n\r\n"
_REQUEST_LINE: Final = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([\x21-\x7e]+) HTTP/1\.1")
_FIELDS: Final = re.compile(r"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\x20-\x7e\t]*\r\n)*")
"""Every header field line, each with its CRLF: a token, a colon, printable text."""
_DIGITS: Final = re.compile(r"[0-9]{1,18}")
_UNFRAMED_FIELDS: Final = frozenset({"transfer-encoding", "expect", "upgrade"})


class HeadTooLarge(ValueError):
    """No end of the head within the limit."""


class Head(NamedTuple):
    """Immutable, and made for every request: a ``NamedTuple`` costs a fifth of what a
    frozen dataclass does to build (``object.__setattr__`` per field)."""

    size: int
    """Bytes of the request line and header fields, the blank line included."""
    method: str = ""
    target: str = ""
    body: int = 0
    """``Content-Length`` (0 when absent); meaningless when not ``framed``."""
    keep_alive: bool = False
    framed: bool = False
    """Read strictly: the request ends ``size + body`` bytes after it starts."""
    encoded: bool = False
    """A ``Content-Encoding`` other than ``identity``: the body must be inflated."""

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


def read_head(buffer: bytes | bytearray, limit: int) -> Head | None:
    """The head at the start of ``buffer``; ``None`` until its blank line has arrived;
    ``HeadTooLarge`` when ``limit`` bytes came without one."""
    end = buffer.find(END, 0, limit + len(END))
    if end < 0:
        if len(buffer) >= limit + len(END):
            raise HeadTooLarge(f"no end of the request head within {limit} bytes")
        return None
    size = end + len(END)
    try:
        text = bytes(buffer[:end]).decode("ascii")
    except UnicodeDecodeError:
        return Head(size)
    request_line, crlf, fields = text.partition("\r\n")
    line = _REQUEST_LINE.fullmatch(request_line)
    if line is None:
        return Head(size)
    method, target = line.group(1), line.group(2)
    # one pass of the regular expression over all the fields, then plain splits
    if crlf and _FIELDS.fullmatch(fields + crlf) is None:
        return Head(size, method, target)
    length: int | None = None
    keep_alive = True
    encoded = False
    for raw in fields.split("\r\n") if crlf else ():
        name, _, value = raw.partition(":")
        name, value = name.lower(), value.strip(" \t")
        if name in _UNFRAMED_FIELDS:
            return Head(size, method, target)
        if name == "content-length":
            if length is not None or _DIGITS.fullmatch(value) is None:
                return Head(size, method, target)
            length = int(value)
        elif name == "connection":
            tokens = {token.strip().lower() for token in value.split(",")}
            keep_alive = keep_alive and "close" not in tokens
        elif name == "content-encoding":
            encoded = encoded or value.lower() not in ("", "identity")
    return Head(size, method, target, length or 0, keep_alive, framed=True, encoded=encoded)
