"""Making keys and certificates, and reading them back from PEM.

Layer: PURE. Functions from values to values: the time is a parameter (``now``), files are
bytes handed in or out. Must not read the clock, touch files or print. Key generation and
serial numbers draw on the OS random source through ``cryptography``; nothing else is
hidden input.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.plan import IpAddress, KeyType, LeafSpec, Usage

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

CA_COMMON_NAME = "tessera-ca"
ORGANIZATION = "tessera"
CLOCK_SKEW = timedelta(minutes=5)
"""Certificates start a little in the past so that a peer whose clock lags still accepts them."""

_EKU: dict[Usage, x509.ObjectIdentifier] = {
    "server": ExtendedKeyUsageOID.SERVER_AUTH,
    "client": ExtendedKeyUsageOID.CLIENT_AUTH,
}


class PemError(ValueError):
    """Bytes that are not the PEM certificate or key they should be."""


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its private key (the CA's, or a leaf's)."""

    cert: x509.Certificate
    key: PrivateKey


def generate_key(key_type: KeyType) -> PrivateKey:
    if key_type == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def key_type_of(key: PrivateKey) -> KeyType | None:
    """The ``--key-type`` a key corresponds to, or None for any other kind or size."""
    if isinstance(key, rsa.RSAPrivateKey):
        return "rsa-2048" if key.key_size == 2048 else None
    return "ecdsa-p256" if isinstance(key.curve, ec.SECP256R1) else None


def issue_ca(
    key: PrivateKey, *, now: datetime, validity: timedelta, common_name: str = CA_COMMON_NAME
) -> x509.Certificate:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    start = _second(now)
    name = _name(common_name)
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key, ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )
    return builder.sign(key, hashes.SHA256())


def issue_leaf(
    spec: LeafSpec, key: PrivateKey, ca: Pair, *, now: datetime, validity: timedelta
) -> x509.Certificate:
    """A serving or client certificate for ``spec``, signed by ``ca``.

    It never outlives the CA: a chain whose root expires first fails anyway, and the CA's
    own renewal is what re-issues it.
    """
    start = _second(now)
    end = min(start + validity, ca.cert.not_valid_after_utc)
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(spec.common_name))
        .issuer_name(ca.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key, ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([_EKU[spec.usage]]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    general_names: list[x509.GeneralName] = [x509.DNSName(n) for n in spec.dns_names]
    general_names += [x509.IPAddress(ip) for ip in spec.ip_addresses]
    if general_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names), critical=False)
    return builder.sign(ca.key, hashes.SHA256())


# ---------------------------------------------------------------- PEM in and out


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_certs(pem: bytes) -> tuple[x509.Certificate, ...]:
    """Every certificate in a PEM file, in order; at least one."""
    try:
        certs = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise PemError(f"not a PEM certificate ({exc})") from None
    return certs


def load_key(pem: bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise PemError("the private key is encrypted; a server cannot unlock it") from None
    except ValueError as exc:
        raise PemError(f"not a PEM private key ({_first_line(exc)})") from None
    except UnsupportedAlgorithm as exc:
        raise PemError(f"not a usable private key ({_first_line(exc)})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PemError(f"a {type(key).__name__} key is not supported: use ECDSA or RSA")
    return key


def load_pair(cert_data: bytes, key_data: bytes) -> Pair:
    """The first certificate of ``cert_data`` with its key; raises if they do not belong."""
    cert = load_certs(cert_data)[0]
    key = load_key(key_data)
    if not key_matches(cert, key):
        raise PemError("the private key does not match the certificate")
    return Pair(cert, key)


# ---------------------------------------------------------------- reading certificates


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    return bool(cert.public_key() == key.public_key())


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def usage_of(cert: x509.Certificate) -> frozenset[Usage]:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(usage for usage, oid in _EKU.items() if oid in eku)


def names_of(cert: x509.Certificate) -> tuple[frozenset[str], frozenset[IpAddress]]:
    """The DNS and IP subject alternative names."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset(), frozenset()
    ips = frozenset(
        ip
        for ip in san.get_values_for_type(x509.IPAddress)
        if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)
    )
    return frozenset(n.lower() for n in san.get_values_for_type(x509.DNSName)), ips


def common_name_of(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else ""


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(key: PrivateKey, *, ca: bool) -> x509.KeyUsage:
    # RSA key exchange needs keyEncipherment on TLS 1.2 peers that still offer it; ECDSA
    # keys only ever sign.
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca and isinstance(key, rsa.RSAPrivateKey),
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _second(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.replace(microsecond=0)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
