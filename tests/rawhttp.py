"""A raw HTTP/1.1 answer read off a socket, byte by byte as the server wrote it: for the
tests that send requests by hand (the guard's, the routes')."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cluster import jsonio


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonio.loads(self.body)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    raw = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = raw.decode().rstrip("\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)
