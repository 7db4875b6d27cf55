"""Prometheus' HTTP API, read for ``tessera capacity --prometheus``: one ``query_range``
per query the report needs.

Layer: I/O (aiohttp). Must not judge anything: the series go to the PURE
``console.capacity_range`` as they came, placed on the report's steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import aiohttp

from cluster import jsonio
from console.capacity_range import Series, parse_range
from console.output import ConsoleError

TIMEOUT_S: Final = 30.0
"""A week of hourly points per queue comes back in well under a second; a Prometheus
that takes this long is struggling and the user is told so."""


async def query_ranges(
    url: str, queries: Mapping[str, str], *, start: float, end: float, step_s: float
) -> dict[str, list[Series]]:
    """Each query over ``[start, end]`` every ``step_s`` seconds, by the same names."""
    steps = max(1, round((end - start) / step_s) + 1)
    found: dict[str, list[Series]] = {}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for name, query in queries.items():
            params = {"query": query, "start": repr(start), "end": repr(end), "step": f"{step_s:g}"}
            try:
                async with session.get(
                    f"{url.rstrip('/')}/api/v1/query_range", params=params
                ) as got:
                    body = await got.read()
                    status = got.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ConsoleError(
                    f"Prometheus at {url}: {str(exc) or type(exc).__name__}"
                ) from None
            try:
                answer = jsonio.loads(body)
            except jsonio.JsonError:
                answer = None
            if status != 200 or not isinstance(answer, dict) or answer.get("status") != "success":
                said = (
                    answer.get("error")
                    if isinstance(answer, dict)
                    else body[:200].decode(errors="replace")
                )
                raise ConsoleError(f"Prometheus at {url} refused {query!r}: HTTP {status}: {said}")
            found[name] = parse_range(answer.get("data"), start, step_s, steps)
    return found
