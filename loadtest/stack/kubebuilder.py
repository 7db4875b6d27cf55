"""What a Kubebuilder-made controller manager (Kueue's, JobSet's) needs to run on loopback
instead of behind a Service: a serving certificate the API server trusts for 127.0.0.1, and
the webhook configurations of its release pointed at it by URL.

Layer: I/O (test support: makes keys, writes certificate files). The rewriting of webhook
configurations is pure and must change nothing but what an install's kustomize patches
would and where the webhooks are reached; nothing here decides how Kueue, JobSet or Tessera
behave.

Both projects publish ``config/components/webhook/manifests.yaml``: configurations named
``mutating-webhook-configuration`` / ``validating-webhook-configuration`` whose webhooks
name a Service ``webhook-service`` in namespace ``system``; their ``config/default``
kustomization then prefixes every name (``kueue-``, ``jobset-``) and patches some webhooks
(selectors). ``webhook_configurations`` does the same and gives each webhook a ``url:``
on 127.0.0.1 with the CA of ``make_certs``.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from loadtest.ports import LOOPBACK, free_port

WEBHOOK_CONFIG_KINDS: Final = frozenset(
    {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
)


@dataclass(frozen=True, slots=True)
class ServingCerts:
    """A CA and a serving certificate it signed, PEM."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_crt).decode()

    def secret(self, name: str, namespace: str) -> dict[str, Any]:
        """The Secret a manager's internal certificate rotator keeps its pair in."""

        def encoded(data: bytes) -> str:
            return base64.b64encode(data).decode()

        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque",
            "data": {
                "ca.crt": encoded(self.ca_crt),
                "ca.key": encoded(self.ca_key),
                "tls.crt": encoded(self.tls_crt),
                "tls.key": encoded(self.tls_key),
            },
        }

    def write_cert_dir(self, folder: Path) -> Path:
        """``tls.crt`` and ``tls.key`` in ``folder``, where controller-runtime's webhook
        server reads them (its ``CertDir``)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tls.crt").write_bytes(self.tls_crt)
        (folder / "tls.key").write_bytes(self.tls_key)
        (folder / "tls.key").chmod(0o600)
        return folder


_CA_USAGE: Final = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=True,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1 ("RSA PRIVATE KEY"): the only form cert-controller's rotator parses a CA key in.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(organization: str, common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_certs(
    now: datetime.datetime, *, organization: str, ca_name: str, service: str, namespace: str
) -> ServingCerts:
    """A CA named ``ca_name`` and a serving certificate for the Service ``service`` in
    ``namespace`` *and* 127.0.0.1 (what the API server dials). Both outlive the 90-day
    look-ahead of cert-controller's rotator (which Kueue and JobSet run when managing
    their own certificates), so it keeps them as they are."""
    ca_key = _rsa_key()
    start = now - datetime.timedelta(hours=1)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(organization, ca_name))
        .issuer_name(_name(organization, ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = _rsa_key()
    dns = f"{service}.{namespace}.svc"
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(organization, dns))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(dns),
                    x509.DNSName(f"{dns}.cluster.local"),
                    x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ServingCerts(
        ca_crt=ca.public_bytes(serialization.Encoding.PEM),
        ca_key=_pem_key(ca_key),
        tls_crt=leaf.public_bytes(serialization.Encoding.PEM),
        tls_key=_pem_key(key),
    )


@dataclass(frozen=True, slots=True)
class ManagerPorts:
    """A manager's listeners, all on 127.0.0.1."""

    webhook: int
    health: int
    metrics: int

    @classmethod
    def pick(cls) -> ManagerPorts:
        return cls(free_port(), free_port(), free_port())


def _keep_all(webhook: Mapping[str, Any]) -> bool:
    return True


def webhook_configurations(
    documents: Iterable[Mapping[str, Any]],
    *,
    name_prefix: str,
    port: int,
    ca_bundle: str,
    keep: Callable[[Mapping[str, Any]], bool] = _keep_all,
    patches: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The release's webhook configurations as its install registers them: each named
    with ``name_prefix``, holding the webhooks ``keep`` accepts, each webhook's fields
    set from ``patches[webhook name]`` (what the install's kustomize patches set), and
    each ``clientConfig`` a URL on loopback with ``ca_bundle``."""
    out = []
    for document in documents:
        if document.get("kind") not in WEBHOOK_CONFIG_KINDS:
            continue
        config = copy.deepcopy(dict(document))
        config["metadata"] = {"name": name_prefix + document["metadata"]["name"]}
        hooks = []
        for webhook in config.get("webhooks") or []:
            if not keep(webhook):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"https://{LOOPBACK}:{port}{path}",
                "caBundle": ca_bundle,
            }
            webhook.update(copy.deepcopy(dict((patches or {}).get(webhook["name"], {}))))
            hooks.append(webhook)
        config["webhooks"] = hooks
        out.append(config)
    return out
