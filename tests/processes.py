"""Test helper: a server's ``python -m`` started as a child process, probed until ready
and stopped as Kubernetes stops a pod (SIGTERM); or an aiohttp app served in the test's
own process on a loopback port of its own.

Layer: I/O, tests only (processes, sockets). Says nothing about what the server answers:
each test asserts that itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]


@dataclass(slots=True)
class ServerProcess:
    process: asyncio.subprocess.Process
    logged: str = ""
    """Everything it wrote to stderr, once the block has ended."""

    async def stop(self) -> int:
        """SIGTERM, then its exit code (within 30 s)."""
        self.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def server_main(
    module: str, *args: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[ServerProcess]:
    """``python -m module args`` from the repository; killed if still running at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    server = ServerProcess(process)
    try:
        yield server
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stderr is not None
        server.logged = (await process.stderr.read()).decode()


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    """Until ``GET url`` answers 200 (connection refused meanwhile: still starting)."""
    async with asyncio.timeout(timeout_s):
        while True:
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` over plain HTTP on a free loopback port, for the block; its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
