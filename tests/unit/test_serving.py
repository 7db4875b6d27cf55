"""The servers' shared plumbing: background work that must not die unnoticed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from server import serving


async def test_background_work_that_fails_is_logged_while_the_server_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def watch() -> None:
        raise RuntimeError("the watch lost its API server")

    logged_while_running: list[str] = []

    async def serve_a_while() -> None:
        async with serving.background(watch(), "watch nodes"):
            await asyncio.sleep(0.01)
            logged_while_running.append(caplog.text)

    # logged at once, then raised again when the server shuts the block down
    with (
        caplog.at_level(logging.ERROR, logger="server.serving"),
        pytest.raises(RuntimeError, match="lost its API server"),
    ):
        await serve_a_while()
    assert "background task ended" in logged_while_running[0]
    assert "the watch lost its API server" in logged_while_running[0]


async def test_background_work_stops_with_the_block() -> None:
    stopped = asyncio.Event()

    async def loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async with serving.background(loop(), "expire assumptions"):
        await asyncio.sleep(0)
        assert not stopped.is_set()
    assert stopped.is_set()
