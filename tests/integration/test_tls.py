"""Serving TLS from files: real handshakes against an aiohttp server on 127.0.0.1.

Certificates come from the `certs` package (the same code as `python -m certs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from certs.issue import cert_pem, generate_key, issue_leaf, key_pem
from certs.plan import make_plan, service_names
from certs.store import write_atomic
from cluster.clock import SystemClock
from server import serving
from server.tls import CertReloader, TLSConfigError, client_context, server_context
from tests.certfiles import MTLS_CLIENTS, Material, make_material

POLL = 0.02
WEBHOOK_SANS = (*service_names("tessera-webhook", "tessera-system"), "localhost", "127.0.0.1")


# ---------------------------------------------------------------- builders


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Material:
    """Certificates from another CA, with the very same names."""
    return make_material(tmp_path_factory.mktemp("other-ca"))


async def ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(0.3)
    return web.Response(text="slow")


@contextlib.asynccontextmanager
async def serve(context: ssl.SSLContext) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_post("/bind", ok)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock, ssl_context=context)
    await site.start()
    try:
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()


async def peer_certificate(
    port: int, context: ssl.SSLContext, server_hostname: str = "localhost"
) -> x509.Certificate:
    """Handshake, and return the certificate the server presented."""
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_hostname
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


async def post_bind(port: int, context: ssl.SSLContext) -> int:
    connector = aiohttp.TCPConnector(ssl=context, force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"https://127.0.0.1:{port}/bind", server_hostname="localhost") as response,
    ):
        await response.read()
        return response.status


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", WEBHOOK_SANS)
async def test_verification_succeeds_for_every_name_in_the_certificate(
    material: Material, name: str
) -> None:
    served = server_context(material["webhook.crt"], material["webhook.key"])
    async with serve(served) as port:
        cert = await peer_certificate(port, client_context(material["ca.crt"]), name)
    assert cert == x509.load_pem_x509_certificate(material["webhook.crt"].read_bytes())


@pytest.mark.parametrize("name", ["tessera-extender", "evil.example.com", "127.0.0.2"])
async def test_verification_fails_for_a_name_not_in_the_certificate(
    material: Material, name: str
) -> None:
    served = server_context(material["webhook.crt"], material["webhook.key"])
    async with serve(served) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            await peer_certificate(port, client_context(material["ca.crt"]), name)


async def test_a_client_trusting_another_ca_refuses_the_server(
    material: Material, stranger: Material
) -> None:
    served = server_context(material["webhook.crt"], material["webhook.key"])
    async with serve(served) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            await peer_certificate(port, client_context(stranger["ca.crt"]))


async def test_only_modern_protocols_and_ciphers(material: Material) -> None:
    served = server_context(material["webhook.crt"], material["webhook.key"])
    assert served.minimum_version == ssl.TLSVersion.TLSv1_2
    tls12 = client_context(material["ca.crt"])
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    async with serve(served) as port:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls12, server_hostname="localhost"
        )
        cipher, version, _ = writer.get_extra_info("cipher")
        writer.close()
        await writer.wait_closed()
    assert version == "TLSv1.2"
    assert cipher.startswith("ECDHE-")
    assert "GCM" in cipher or "CHACHA20" in cipher


# ---------------------------------------------------------------- mutual TLS (the extender)


@pytest.mark.parametrize(("client", "accepted"), MTLS_CLIENTS)
async def test_mutual_tls_lets_only_kube_scheduler_bind(
    material: Material,
    stranger: Material,
    client: Callable[[Material, Material], ssl.SSLContext],
    accepted: bool,
) -> None:
    served = server_context(
        material["extender.crt"], material["extender.key"], client_ca=material["ca-bundle.crt"]
    )
    async with serve(served) as port:
        if accepted:
            assert await post_bind(port, client(material, stranger)) == 200
        else:
            with pytest.raises(aiohttp.ClientError):
                await post_bind(port, client(material, stranger))


# ---------------------------------------------------------------- renewal


class SecretVolume:
    """A folder laid out like a mounted Secret: tls.crt -> ..data/tls.crt, ..data -> ..<n>."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        for name in ("tls.crt", "tls.key"):
            os.symlink(f"..data/{name}", root / name)

    def project(self, cert: bytes, key: bytes) -> None:
        """What the kubelet does: write a new folder, swap ..data in one rename, drop the old."""
        old = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        self.generation += 1
        folder = self.root / f"..2026_01_01_00_00_0{self.generation}"
        folder.mkdir()
        (folder / "tls.crt").write_bytes(cert)
        (folder / "tls.key").write_bytes(key)
        os.symlink(folder.name, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", self.root / "..data")
        if old is not None:
            shutil.rmtree(old)

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"


def reissue(material: Material, name: str = "localhost") -> tuple[bytes, bytes]:
    """A new webhook certificate from the same CA, as a renewal would make."""
    spec = next(s for s in make_plan(dns=[name], ips=["127.0.0.1"]).leaves())
    key = generate_key("ecdsa-p256")
    cert = issue_leaf(spec, key, material.ca(), now=SystemClock().now(), validity=timedelta(days=9))
    return cert_pem(cert), key_pem(key)


@dataclass
class Stream:
    """GET / one after another until stopped, noting which certificate served each answer.

    Plain asyncio streams rather than a client library, so that the TLS connection under
    each answer is in hand: ``keep_alive`` sends every request on one connection, otherwise
    each request opens a new one (a new handshake).
    """

    port: int
    trust: ssl.SSLContext
    keep_alive: bool
    served: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not stop.is_set():
            try:
                if connection is None:
                    connection = await asyncio.open_connection(
                        "127.0.0.1", self.port, ssl=self.trust, server_hostname="localhost"
                    )
                reader, writer = connection
                await self._get(reader, writer)
                if not self.keep_alive:
                    await _close(writer)
                    connection = None
            except Exception as exc:
                self.errors.append(exc)
                connection = None
            await asyncio.sleep(0.002)
        if connection is not None:
            await _close(connection[1])

    async def _get(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        close = "" if self.keep_alive else "Connection: close\r\n"
        writer.write(f"GET / HTTP/1.1\r\nHost: localhost\r\n{close}\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = next(
            int(line.split(b":")[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        assert (status, body) == (b"200", b"ok")
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        self.served.append(x509.load_der_x509_certificate(der).serial_number)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def serves(port: int, trust: ssl.SSLContext, serial: int) -> bool:
    """Whether a new connection gets the certificate ``serial`` within a few seconds."""
    for _ in range(250):
        if (await peer_certificate(port, trust)).serial_number == serial:
            return True
        await asyncio.sleep(POLL)
    return False


async def answered(stream: Stream, count: int) -> None:
    """Until ``stream`` has had ``count`` answers: counted, not timed, so that a slow
    machine makes the test slower rather than wrong."""
    async with asyncio.timeout(10):
        # the stream runs in its own task and has no signal of its own: poll
        while len(stream.served) < count:  # noqa: ASYNC110
            await asyncio.sleep(POLL)


async def test_a_symlink_swap_is_served_without_dropping_a_request(
    material: Material, tmp_path: Path
) -> None:
    volume = SecretVolume(tmp_path)
    volume.project(material["webhook.crt"].read_bytes(), material["webhook.key"].read_bytes())
    reloader = CertReloader(volume.cert, volume.key, interval=POLL)
    old_serial = reloader.certificate.serial_number
    trust = client_context(material["ca.crt"])

    async with (
        serve(reloader.context) as port,
        serving.background(reloader.run(), "reload certificates"),
    ):
        stop = asyncio.Event()
        keep_alive = Stream(port, trust, keep_alive=True)
        fresh = Stream(port, trust, keep_alive=False)
        streams = [asyncio.create_task(s.run(stop)) for s in (keep_alive, fresh)]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as session:
            in_flight = asyncio.create_task(
                session.get(f"https://127.0.0.1:{port}/slow", server_hostname="localhost")
            )
            await answered(keep_alive, 1)

            new_cert, new_key = reissue(material)
            volume.project(new_cert, new_key)
            new_serial = x509.load_pem_x509_certificate(new_cert).serial_number
            assert await serves(port, trust, new_serial)
            # the kept-alive connection goes on answering after the swap
            await answered(keep_alive, len(keep_alive.served) + 3)

            stop.set()
            await asyncio.gather(*streams)
            async with await in_flight as response:
                assert (response.status, await response.text()) == (200, "slow")

    assert keep_alive.errors == []
    assert fresh.errors == []
    # New connections moved to the new certificate; the kept-alive one never noticed.
    assert {old_serial, new_serial} <= set(fresh.served)
    assert fresh.served[-1] == new_serial
    assert set(keep_alive.served) == {old_serial}
    assert reloader.certificate.serial_number == new_serial


async def test_a_broken_new_pair_is_logged_and_the_old_one_keeps_serving(
    material: Material, stranger: Material, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path)
    volume.project(material["webhook.crt"].read_bytes(), material["webhook.key"].read_bytes())
    reloader = CertReloader(volume.cert, volume.key, interval=POLL)
    good = reloader.certificate
    trust = client_context(material["ca.crt"])

    async with serve(reloader.context) as port:
        volume.project(material["webhook.crt"].read_bytes(), stranger["webhook.key"].read_bytes())
        with caplog.at_level(logging.WARNING, logger="server.tls"):
            assert reloader.check() is False
        assert "still serving the previous one" in caplog.text
        assert (await peer_certificate(port, trust)) == good
        assert reloader.check() is False  # the same broken files are not retried every poll

        new_cert, new_key = reissue(material)
        volume.project(new_cert, new_key)
        assert reloader.check() is True
        assert (await peer_certificate(port, trust)).serial_number == (
            x509.load_pem_x509_certificate(new_cert).serial_number
        )


def test_an_in_place_atomic_replace_is_noticed_too(material: Material, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(material["webhook.crt"], cert)
    shutil.copy(material["webhook.key"], key)
    reloader = CertReloader(cert, key, interval=POLL)
    assert reloader.check() is False

    new_cert, new_key = reissue(material, name="renewed.example.com")
    write_atomic(key, new_key, 0o600)
    write_atomic(cert, new_cert, 0o644)
    assert reloader.check() is True
    assert "renewed.example.com" in str(reloader.certificate.extensions)


async def test_a_ca_rollover_reaches_the_extender_without_a_restart(
    material: Material, stranger: Material, tmp_path: Path
) -> None:
    """After a CA renewal the bundle lists the new and the old CA: both kube-scheduler
    certificates are then accepted, the new one without restarting the extender."""
    client_ca = tmp_path / "ca-bundle.crt"
    shutil.copy(material["ca-bundle.crt"], client_ca)
    reloader = CertReloader(
        material["extender.crt"], material["extender.key"], client_ca=client_ca, interval=POLL
    )
    trust = client_context(material["ca.crt"])
    old_client = client_context(
        material["ca.crt"], material["kube-scheduler.crt"], material["kube-scheduler.key"]
    )
    new_client = client_context(
        material["ca.crt"], stranger["kube-scheduler.crt"], stranger["kube-scheduler.key"]
    )
    async with serve(reloader.context) as port:
        with pytest.raises(aiohttp.ClientError):
            await post_bind(port, new_client)

        rolled = stranger["ca.crt"].read_bytes() + material["ca.crt"].read_bytes()
        write_atomic(client_ca, rolled, 0o644)
        assert reloader.check() is True
        assert await post_bind(port, new_client) == 200
        assert await post_bind(port, old_client) == 200
        assert (await peer_certificate(port, trust)) == reloader.certificate


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("break_files", "culprit", "problem"),
    [
        pytest.param(
            lambda d: (d / "tls.crt").unlink(), "tls.crt", "cannot read", id="missing-cert"
        ),
        pytest.param(
            lambda d: (d / "tls.key").unlink(), "tls.key", "cannot read", id="missing-key"
        ),
        pytest.param(
            lambda d: (d / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\ngarbage\n"),
            "tls.crt",
            "not a PEM certificate",
            id="garbage-cert",
        ),
        pytest.param(
            lambda d: (d / "tls.key").write_text("hello"),
            "tls.key",
            "not a PEM private key",
            id="garbage-key",
        ),
        pytest.param(
            lambda d: shutil.copy(d / "other.key", d / "tls.key"),
            "tls.key",
            "does not match the certificate in",
            id="mismatched-key",
        ),
        pytest.param(
            lambda d: (d / "tls.key").chmod(0),
            "tls.key",
            "cannot read: Permission denied",
            id="unreadable",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-0 file"),
        ),
        pytest.param(
            lambda d: ((d / "tls.key").unlink(), (d / "tls.key").mkdir()),
            "tls.key",
            "cannot read: Is a directory",
            id="key-is-a-folder",
        ),
    ],
)
def test_a_bad_file_is_a_one_line_error_naming_it(
    material: Material,
    tmp_path: Path,
    break_files: Callable[[Path], object],
    culprit: str,
    problem: str,
) -> None:
    shutil.copy(material["webhook.crt"], tmp_path / "tls.crt")
    shutil.copy(material["webhook.key"], tmp_path / "tls.key")
    shutil.copy(material["extender.key"], tmp_path / "other.key")
    break_files(tmp_path)
    for load in (
        lambda: server_context(tmp_path / "tls.crt", tmp_path / "tls.key"),
        lambda: CertReloader(tmp_path / "tls.crt", tmp_path / "tls.key"),
    ):
        with pytest.raises(TLSConfigError) as raised:
            load()
        assert raised.value.path == tmp_path / culprit
        assert str(raised.value).startswith(f"{tmp_path / culprit}: {problem}")
        assert "\n" not in str(raised.value)


def test_a_bad_client_ca_is_named(material: Material, tmp_path: Path) -> None:
    bad = tmp_path / "client-ca.crt"
    bad.write_text("not a certificate")
    with pytest.raises(TLSConfigError, match=r"client-ca\.crt: not a PEM certificate"):
        server_context(material["extender.crt"], material["extender.key"], client_ca=bad)
    with pytest.raises(TLSConfigError, match=r"client-ca\.crt: not a PEM certificate"):
        client_context(bad)
