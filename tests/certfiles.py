"""Certificate folders for tests, made by the same code as ``python -m certs``."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from certs.issue import Pair, load_pair
from certs.plan import make_plan
from certs.renew import reconcile
from certs.store import read_files, write_files
from cluster.clock import SystemClock
from server.tls import client_context


@dataclass(frozen=True, slots=True)
class Material:
    """A folder as `python -m certs --dns localhost --ip 127.0.0.1` leaves it."""

    folder: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name

    def ca(self) -> Pair:
        return load_pair(self["ca.crt"].read_bytes(), self["ca.key"].read_bytes())


def make_material(folder: Path) -> Material:
    plan = make_plan(dns=["localhost"], ips=["127.0.0.1"])
    outcome = reconcile({}, plan, SystemClock().now())
    write_files(folder, outcome.files, read_files(folder, ()))
    return Material(folder)


def _client(
    own: Callable[[Material, Material], Material], cert: str | None
) -> Callable[[Material, Material], ssl.SSLContext]:
    def context(material: Material, stranger: Material) -> ssl.SSLContext:
        if cert is None:
            return client_context(material["ca.crt"])
        folder = own(material, stranger)
        return client_context(material["ca.crt"], folder[f"{cert}.crt"], folder[f"{cert}.key"])

    return context


def _ours(material: Material, stranger: Material) -> Material:
    return material


def _theirs(material: Material, stranger: Material) -> Material:
    return stranger


MTLS_CLIENTS = [
    pytest.param(_client(_ours, None), False, id="no-client-cert"),
    pytest.param(_client(_theirs, "kube-scheduler"), False, id="client-cert-from-another-ca"),
    pytest.param(_client(_ours, "webhook"), False, id="serving-cert-used-as-client-cert"),
    pytest.param(_client(_ours, "kube-scheduler"), True, id="kube-scheduler"),
]
"""Who may call a server that requires client certificates from our CA: only
kube-scheduler's certificate (``(material, stranger) -> client context``, accepted?)."""
