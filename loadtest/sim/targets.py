"""The two servers under test: started here (standalone) or reached at given URLs.

Layer: I/O. Starts ``python -m webhook`` (TLS, fresh certificates from ``python -m
certs`` in a temporary folder, policy from a file) and ``python -m extender`` (plain HTTP
on loopback, watching the load test's ``MiniApiServer`` through a kubeconfig) as child
processes, waits for their ``/readyz``, and gives the simulator one aiohttp session per
server with the TLS settings to verify them. For a real deployment, ``remote`` takes
URLs, the CA and client certificates instead. Reads RSS from ``/proc`` for servers it
started. Must not decide anything: it connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from cluster import jsonio
from cluster.clock import Clock
from loadtest.measure.pinned import ROOT, make_certs, proc_memory
from loadtest.ports import free_port
from server.tls import client_context


class TargetError(Exception):
    """A server did not start or is not reachable; the message says which and why."""


@dataclass(slots=True)
class Target:
    """One server as the simulator sees it."""

    name: str
    url: str
    session: aiohttp.ClientSession
    tls: ssl.SSLContext | None = None
    """How to reach it (the same settings the session uses); None: plain HTTP."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    rss_samples: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the run started, RSS bytes), for servers started here."""

    def note_rss(self, at_s: float) -> None:
        if self.process is not None and self.process.poll() is None:
            self.rss_samples.append((at_s, proc_memory(self.process.pid).get("VmRSS", 0)))

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass(slots=True)
class Targets:
    webhook: Target
    extender: Target
    local: bool


def write_objects(path: Path, objects: Sequence[dict[str, Any]]) -> Path:
    """A ``List`` file that ``cluster.files`` reads (JSON is YAML)."""
    path.write_bytes(jsonio.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    return path


def _start(module: str, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(  # noqa: S603 - our interpreter, our arguments
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _wait_ready(target: Target, clock: Clock, deadline_s: float) -> None:
    give_up = clock.monotonic() + deadline_s
    while True:
        if target.process is not None and target.process.poll() is not None:
            raise TargetError(f"{target.name} exited at start:\n{target.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with target.session.get(target.url + "/readyz") as response:
                if response.status == 200:
                    return
        if clock.monotonic() > give_up:
            raise TargetError(f"{target.name} at {target.url} not ready in {deadline_s:.0f} s")
        await asyncio.sleep(0.1)


def _session(context: ssl.SSLContext | None, connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        ssl=context if context is not None else False, limit=connections
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10))


@contextlib.asynccontextmanager
async def local_servers(
    folder: Path,
    policy: Sequence[dict[str, Any]],
    kubeconfig: Path,
    extender_args: Sequence[str],
    clock: Clock,
) -> AsyncIterator[Targets]:
    """Both servers as child processes, ready; stopped on exit."""
    certs = folder / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    try:
        make_certs(certs)
    except Exception as exc:
        raise TargetError(f"cannot make certificates: {exc}") from exc
    policy_file = write_objects(folder / "policy.json", policy)
    webhook_port, extender_port = free_port(), free_port()
    webhook_log, extender_log = folder / "webhook.log", folder / "extender.log"
    webhook_args = ["--host", "127.0.0.1", "--port", str(webhook_port)]
    webhook_args += [
        "--tls-cert",
        str(certs / "webhook.crt"),
        "--tls-key",
        str(certs / "webhook.key"),
    ]
    webhook_args += ["--policy-file", str(policy_file), "--log-level", "WARNING"]
    ext_args = ["--host", "127.0.0.1", "--port", str(extender_port)]
    ext_args += ["--kubeconfig", str(kubeconfig), "--log-level", "WARNING", *extender_args]
    webhook_process = _start("webhook", webhook_args, webhook_log)
    extender_process = _start("extender", ext_args, extender_log)
    webhook_ctx = client_context(certs / "ca.crt")
    webhook = Target(
        "webhook",
        f"https://127.0.0.1:{webhook_port}",
        _session(webhook_ctx, 64),
        webhook_ctx,
        webhook_process,
        webhook_log,
    )
    extender = Target(
        "extender",
        f"http://127.0.0.1:{extender_port}",
        _session(None, 8),
        None,
        extender_process,
        extender_log,
    )
    try:
        await asyncio.gather(_wait_ready(webhook, clock, 30.0), _wait_ready(extender, clock, 30.0))
        yield Targets(webhook, extender, local=True)
    finally:
        await webhook.session.close()
        await extender.session.close()
        _stop(webhook_process)
        _stop(extender_process)


@contextlib.asynccontextmanager
async def remote(
    webhook_url: str,
    extender_url: str,
    clock: Clock,
    *,
    ca: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> AsyncIterator[Targets]:
    """Servers of a real deployment: the webhook verified against ``ca``; the extender
    over HTTPS (with the client certificate, for its mutual TLS) when its URL says so."""
    webhook_ctx = client_context(ca) if ca is not None else ssl.create_default_context()
    extender_ctx: ssl.SSLContext | None = None
    if extender_url.startswith("https://"):
        if ca is not None:
            extender_ctx = client_context(ca, client_cert, client_key)
        else:
            extender_ctx = ssl.create_default_context()
    webhook = Target("webhook", webhook_url.rstrip("/"), _session(webhook_ctx, 64), webhook_ctx)
    extender = Target("extender", extender_url.rstrip("/"), _session(extender_ctx, 8), extender_ctx)
    try:
        await asyncio.gather(_wait_ready(webhook, clock, 10.0), _wait_ready(extender, clock, 10.0))
        yield Targets(webhook, extender, local=False)
    finally:
        await webhook.session.close()
        await extender.session.close()
