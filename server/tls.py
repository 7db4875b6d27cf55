"""TLS for the servers: SSL contexts from certificate files, reloaded when the files change.

Layer: I/O (reads certificate files, polls them). Must not make certificates (``certs``
does) and must not log key material: files are named by path only.

A bad file is a ``TLSConfigError`` whose one-line message starts with the file's path, so a
server can exit at start with that line instead of a traceback. Once serving, a
``CertReloader`` watches the files and loads a changed pair into the *same* context:
OpenSSL copies the certificate into each connection when it is accepted, so connections
already open (and requests in flight on them) keep the old certificate while every new
handshake gets the new one. A broken new pair is logged and the old one keeps serving.

Kubernetes updates a mounted Secret by writing a new ``..2024_xx`` folder and swapping
the ``..data`` symlink, so a file is identified by ``stat`` of its resolved path (which
changes with the swap), not by its own name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from cluster import logs

log = logging.getLogger(__name__)

# TLS 1.2 suites with forward secrecy and AEAD only; TLS 1.3 suites are all modern and
# OpenSSL keeps them separate from this list.
MODERN_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
DEFAULT_RELOAD_INTERVAL = 10.0
"""Seconds between polls. The kubelet takes up to a minute to project a renewed Secret."""

StrPath = str | os.PathLike[str]
_Identity = tuple[str, int, int, int, int] | tuple[str, str]


class TLSConfigError(Exception):
    """A certificate, key or CA file that cannot be used; the message starts with its path."""

    def __init__(self, path: StrPath, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True, slots=True)
class _Pair:
    """The bytes of a certificate chain and its key, checked to belong together."""

    cert_file: Path
    chain: bytes
    key: bytes
    leaf: x509.Certificate


# ---------------------------------------------------------------- contexts


def server_context(
    cert_file: StrPath, key_file: StrPath, *, client_ca: StrPath | None = None
) -> ssl.SSLContext:
    """A server context (TLS >= 1.2) serving ``cert_file``; with ``client_ca``, mutual TLS.

    In mutual TLS a client must present a certificate signed by a CA in ``client_ca`` and
    meant for client authentication (OpenSSL refuses a serving certificate as a client's).
    Raises ``TLSConfigError`` naming the file at fault.
    """
    context, _ = _build_server(Path(cert_file), Path(key_file), client_ca)
    return context


def client_context(
    ca_file: StrPath, cert: StrPath | None = None, key: StrPath | None = None
) -> ssl.SSLContext:
    """A client context that trusts ``ca_file`` only, checks host names, and may present
    a client certificate (``cert`` and ``key``, for the extender's mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=_read_ca(Path(ca_file)))
    if (cert is None) != (key is None):
        missing = "key" if key is None else "cert"
        raise TLSConfigError(cert or key or "", f"a client certificate needs its {missing} too")
    if cert is not None and key is not None:
        _load_pair(context, _read_pair(Path(cert), Path(key)))
    return context


def _build_server(
    cert_file: Path, key_file: Path, client_ca: StrPath | None
) -> tuple[ssl.SSLContext, _Pair]:
    context = _new_server_context()
    pair = _read_pair(cert_file, key_file)
    _load_pair(context, pair)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=_read_ca(Path(client_ca)))
    return context, pair


def _new_server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(MODERN_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    return context


# ---------------------------------------------------------------- reloading


class CertReloader:
    """Keeps a server context serving the current contents of its certificate files.

    Build it at start (it raises ``TLSConfigError`` like ``server_context``), hand
    ``reloader.context`` to the server, and run ``await reloader.run()`` as a task for the
    server's lifetime. ``check()`` is one poll, for tests and for a SIGHUP handler.
    A changed ``client_ca`` is added to the trusted CAs; a CA is only dropped by a restart.
    """

    def __init__(
        self,
        cert_file: StrPath,
        key_file: StrPath,
        *,
        client_ca: StrPath | None = None,
        interval: float = DEFAULT_RELOAD_INTERVAL,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.client_ca = Path(client_ca) if client_ca is not None else None
        self.interval = interval
        # Identities are taken before reading, so a change racing the first load is
        # seen by the first poll rather than missed.
        self._pair_seen = self._pair_identity()
        self._ca_seen = self._ca_identity()
        self.context, self._serving = _build_server(self.cert_file, self.key_file, self.client_ca)

    @property
    def certificate(self) -> x509.Certificate:
        """The certificate new connections are served with."""
        return self._serving.leaf

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:
                # The reloader must outlive any surprise: the server keeps its last good pair.
                log.exception("tls reload crashed", extra=logs.fields(cert=str(self.cert_file)))

    def check(self) -> bool:
        """Reload whatever changed since the last poll; True if new certificates are in use."""
        reloaded = False
        identity = self._pair_identity()
        if identity != self._pair_seen:
            reloaded |= self._reload_pair(identity)
        ca_identity = self._ca_identity()
        if ca_identity != self._ca_seen:
            reloaded |= self._reload_ca(ca_identity)
        return reloaded

    def _reload_pair(self, identity: tuple[_Identity, _Identity]) -> bool:
        # A symlink swap between reading the certificate and reading the key would pair
        # an old certificate with a new key: read again until the files held still.
        pair: _Pair | TLSConfigError = TLSConfigError(self.cert_file, "not read")
        for _ in range(3):
            try:
                pair = _read_pair(self.cert_file, self.key_file)
            except TLSConfigError as exc:
                pair = exc
            after = self._pair_identity()
            if after == identity:
                break
            identity = after
        self._pair_seen = identity
        if isinstance(pair, TLSConfigError):
            log.warning(
                "tls certificate not reloaded; still serving the previous one",
                extra=logs.fields(file=str(pair.path), problem=pair.problem),
            )
            return False
        previous = self._serving
        try:
            _load_pair(self.context, pair)
        except TLSConfigError as exc:
            _load_pair(self.context, previous)
            log.warning(
                "tls certificate not reloaded; still serving the previous one",
                extra=logs.fields(file=str(exc.path), problem=exc.problem),
            )
            return False
        self._serving = pair
        log.info(
            "tls certificate reloaded",
            extra=logs.fields(
                cert=str(self.cert_file),
                serial=format(pair.leaf.serial_number, "x"),
                not_after=pair.leaf.not_valid_after_utc.isoformat(),
            ),
        )
        return True

    def _reload_ca(self, identity: _Identity | None) -> bool:
        self._ca_seen = identity
        if self.client_ca is None:
            return False
        try:
            self.context.load_verify_locations(cadata=_read_ca(self.client_ca))
        except TLSConfigError as exc:
            log.warning(
                "tls client CA not reloaded; still trusting the previous one",
                extra=logs.fields(file=str(exc.path), problem=exc.problem),
            )
            return False
        log.info("tls client CA reloaded", extra=logs.fields(client_ca=str(self.client_ca)))
        return True

    def _pair_identity(self) -> tuple[_Identity, _Identity]:
        return _identity(self.cert_file), _identity(self.key_file)

    def _ca_identity(self) -> _Identity | None:
        return _identity(self.client_ca) if self.client_ca is not None else None


def _identity(path: Path) -> _Identity:
    resolved = os.path.realpath(path)
    try:
        st = os.stat(resolved)
    except OSError as exc:
        return resolved, exc.strerror or str(exc)
    return resolved, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


# ---------------------------------------------------------------- reading and checking files


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(path, f"cannot read: {exc.strerror or exc}") from None


def _read_ca(path: Path) -> str:
    """The PEM text of a CA bundle, once it is known to hold certificates."""
    data = _read(path)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSConfigError(path, "not a PEM certificate") from None
    return data.decode("ascii", errors="replace")


def _read_pair(cert_file: Path, key_file: Path) -> _Pair:
    chain = _read(cert_file)
    try:
        leaf = x509.load_pem_x509_certificates(chain)[0]
    except ValueError:
        raise TLSConfigError(cert_file, "not a PEM certificate") from None
    key_data = _read(key_file)
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise TLSConfigError(key_file, "the private key is encrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TLSConfigError(key_file, "not a PEM private key") from None
    if not _same_public_key(leaf, key):
        raise TLSConfigError(key_file, f"does not match the certificate in {cert_file}")
    return _Pair(cert_file=cert_file, chain=chain, key=key_data, leaf=leaf)


def _same_public_key(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    try:
        return bool(cert.public_key() == key.public_key())
    except (ValueError, UnsupportedAlgorithm):
        return False


def _load_pair(context: ssl.SSLContext, pair: _Pair) -> None:
    """Load checked bytes, not the paths: the files may have changed since they were read."""
    try:
        with _private_file(pair.chain) as chain, _private_file(pair.key) as key:
            context.load_cert_chain(chain, key)
    except ssl.SSLError as exc:
        raise TLSConfigError(pair.cert_file, f"OpenSSL refused the pair: {exc}") from None


@contextlib.contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    """A path to ``data`` that nobody else can read, for OpenSSL's path-only API.

    On Linux an anonymous memory file: no disk write, and it works on a read-only root
    filesystem. Elsewhere a 0600 file in a fresh private temp folder.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("tessera-tls", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tessera-tls-") as folder:
        path = os.path.join(folder, "pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
