"""A fake Prometheus for the console's range report: real HTTP on 127.0.0.1, answering
``GET /api/v1/query_range`` from canned series chosen by the query's text.

Layer: test support (I/O). Plays Prometheus' side of its HTTP API (a ``matrix`` result,
``status: success``, 400 with ``errorType``/``error`` for a query it does not know) and
records what it was asked. Must not import Tessera code: it is the other side of the
wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Self

from aiohttp import web

Answer = Callable[[float, float, float], list[dict[str, Any]]]
"""(start, end, step) → the matrix result for one query."""


class FakePrometheus:
    def __init__(self, answers: Mapping[str, Answer]) -> None:
        self.answers = dict(answers)
        self.asked: list[Mapping[str, str]] = []
        self.app = web.Application()
        self.app.router.add_get("/api/v1/query_range", self._query_range)
        self._runner = web.AppRunner(self.app)
        self.url = ""

    async def _query_range(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        self.asked.append(params)
        for needle, answer in self.answers.items():
            if needle in params["query"]:
                start, end, step = (float(params[k]) for k in ("start", "end", "step"))
                result = answer(start, end, step)
                return web.json_response(
                    {"status": "success", "data": {"resultType": "matrix", "result": result}}
                )
        return web.json_response(
            {"status": "error", "errorType": "bad_data", "error": "unknown query"}, status=400
        )

    async def __aenter__(self) -> Self:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def constant(labels: Mapping[str, str], value: float) -> Answer:
    """One series holding ``value`` at every step."""

    def answer(start: float, end: float, step: float) -> list[dict[str, Any]]:
        count = round((end - start) / step) + 1
        values = [[start + i * step, repr(value)] for i in range(count)]
        return [{"metric": dict(labels), "values": values}]

    return answer


def together(*answers: Answer) -> Answer:
    def answer(start: float, end: float, step: float) -> list[dict[str, Any]]:
        return [s for a in answers for s in a(start, end, step)]

    return answer
