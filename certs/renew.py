"""Deciding what to keep and what to (re-)issue, from the files already there.

Layer: PURE. ``reconcile`` takes the current contents of the output folder as bytes, the
``Plan`` and ``now``, and returns every file's new contents plus a line per certificate
saying what happened and why. Must not read the clock or touch files: ``certs.store``
reads and writes, ``certs.__main__`` supplies ``now``.

The CA is the root the cluster trusts (``caBundle``, ``--client-ca``), so it is never
replaced silently: it is created when absent, renewed only within ``renew_before`` of its
expiry, and any other trouble with it is a ``CaError`` for a person to look at. When it is
renewed, the old CA stays in ``ca-bundle.crt`` (the ``caBundle``) until it expires, so a
server still presenting a certificate from the old CA stays trusted while the new caBundle
and the new Secrets roll out; every leaf is re-issued from the new CA in the same run.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from cryptography import x509

from certs.issue import (
    Pair,
    PemError,
    cert_pem,
    common_name_of,
    generate_key,
    is_ca,
    issue_ca,
    issue_leaf,
    key_pem,
    key_type_of,
    load_certs,
    load_pair,
    names_of,
    signed_by,
    usage_of,
)
from certs.plan import KeyType, LeafSpec, Plan

CA = "ca"
BUNDLE_FILE = "ca-bundle.crt"

Action = Literal["created", "renewed", "kept"]


class CaError(ValueError):
    """The CA in the output folder cannot be used and must not be replaced silently."""


@dataclass(frozen=True, slots=True)
class Missing:
    """No usable pair on disk; ``reason`` says what was wrong."""

    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    keep: bool
    reason: str


@dataclass(frozen=True, slots=True)
class OutFile:
    name: str
    data: bytes
    secret: bool


@dataclass(frozen=True, slots=True)
class Report:
    """One line of the run's summary: what happened to one certificate, and why."""

    name: str
    action: Action
    reason: str
    not_after: datetime


@dataclass(frozen=True, slots=True)
class Outcome:
    files: tuple[OutFile, ...]
    reports: tuple[Report, ...]
    ca_bundle: bytes

    @property
    def ca_bundle_b64(self) -> str:
        """The ``caBundle`` field of a webhook configuration: base64 of the PEM bundle."""
        return base64.b64encode(self.ca_bundle).decode("ascii")


def cert_file(name: str) -> str:
    return f"{name}.crt"


def key_file(name: str) -> str:
    return f"{name}.key"


def file_names(plan: Plan) -> tuple[str, ...]:
    """Every file a run of ``plan`` owns in the output folder."""
    stems = (CA, *(spec.name for spec in plan.leaves()))
    return (*(n for s in stems for n in (cert_file(s), key_file(s))), BUNDLE_FILE)


def read_pair(files: Mapping[str, bytes], name: str) -> Pair | Missing:
    cert_data, key_data = files.get(cert_file(name)), files.get(key_file(name))
    if cert_data is None and key_data is None:
        return Missing("no certificate yet")
    if cert_data is None:
        return Missing(f"{cert_file(name)} is missing")
    if key_data is None:
        return Missing(f"{key_file(name)} is missing")
    try:
        return load_pair(cert_data, key_data)
    except PemError as exc:
        return Missing(str(exc))


def decide_ca(ca: Pair, *, now: datetime, renew_before: timedelta) -> Verdict:
    left = ca.cert.not_valid_after_utc - now
    if left <= renew_before:
        return Verdict(False, _expiry(left, renew_before))
    return Verdict(True, _valid_until(ca.cert))


def decide_leaf(
    found: Pair | Missing,
    spec: LeafSpec,
    ca: x509.Certificate,
    *,
    key_type: KeyType,
    now: datetime,
    renew_before: timedelta,
) -> Verdict:
    """Keep a leaf only if it is exactly what ``spec`` asks for and far from expiry."""
    if isinstance(found, Missing):
        return Verdict(False, found.reason)
    cert = found.cert
    if not signed_by(cert, ca):
        return Verdict(False, "not signed by the current CA")
    if spec.usage not in usage_of(cert):
        return Verdict(False, f"not a {spec.usage} certificate (extended key usage)")
    if common_name_of(cert) != spec.common_name:
        return Verdict(False, f"common name is {common_name_of(cert)!r}, not {spec.common_name!r}")
    dns, ips = names_of(cert)
    want_dns, want_ips = frozenset(spec.dns_names), frozenset(spec.ip_addresses)
    if (dns, ips) != (want_dns, want_ips):
        return Verdict(False, _name_change(dns | _texts(ips), want_dns | _texts(want_ips)))
    have_type = key_type_of(found.key)
    if have_type != key_type:
        return Verdict(False, f"key is {have_type or 'of another kind'}, --key-type is {key_type}")
    if cert.not_valid_before_utc > now:
        return Verdict(False, f"not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    left = cert.not_valid_after_utc - now
    if left <= renew_before:
        return Verdict(False, _expiry(left, renew_before))
    return Verdict(True, _valid_until(cert))


def reconcile(files: Mapping[str, bytes], plan: Plan, now: datetime) -> Outcome:
    """The output folder's next contents: unchanged bytes for whatever is kept."""
    out: list[OutFile] = []
    reports: list[Report] = []

    ca, ca_action, ca_reason, retired = _ca(files, plan, now)
    if ca_action == "kept":
        out += [_same(files, cert_file(CA), False), _same(files, key_file(CA), True)]
    else:
        out += [OutFile(cert_file(CA), cert_pem(ca.cert), False)]
        out += [OutFile(key_file(CA), key_pem(ca.key), True)]
    reports.append(Report(CA, ca_action, ca_reason, ca.cert.not_valid_after_utc))

    bundle = _bundle(files, ca, retired, now, fresh=ca_action == "created")
    out.append(OutFile(BUNDLE_FILE, bundle, False))

    for spec in plan.leaves():
        found = read_pair(files, spec.name)
        verdict = decide_leaf(
            found, spec, ca.cert, key_type=plan.key_type, now=now, renew_before=plan.renew_before
        )
        if verdict.keep and isinstance(found, Pair):
            out += [_same(files, cert_file(spec.name), False)]
            out += [_same(files, key_file(spec.name), True)]
            expiry = found.cert.not_valid_after_utc
            reports.append(Report(spec.name, "kept", verdict.reason, expiry))
            continue
        key = generate_key(plan.key_type)
        cert = issue_leaf(spec, key, ca, now=now, validity=plan.validity)
        out += [OutFile(cert_file(spec.name), cert_pem(cert), False)]
        out += [OutFile(key_file(spec.name), key_pem(key), True)]
        action: Action = "renewed" if _any(files, spec.name) else "created"
        reason = "the CA was renewed" if ca_action == "renewed" else verdict.reason
        reports.append(Report(spec.name, action, reason, cert.not_valid_after_utc))
    return Outcome(files=tuple(out), reports=tuple(reports), ca_bundle=bundle)


def _ca(
    files: Mapping[str, bytes], plan: Plan, now: datetime
) -> tuple[Pair, Action, str, x509.Certificate | None]:
    """The CA to sign with, what happened to it, and the CA it replaced (if any)."""
    found = read_pair(files, CA)
    if isinstance(found, Missing):
        if _any(files, CA):
            raise CaError(
                f"the CA in the output folder is unusable: {found.reason}. Restore it, or"
                f" delete {cert_file(CA)} and {key_file(CA)} to create a new CA (every"
                " caBundle and --client-ca must then be updated)"
            )
        key = generate_key(plan.key_type)
        cert = issue_ca(key, now=now, validity=plan.ca_validity)
        return Pair(cert, key), "created", "no CA yet", None
    if not is_ca(found.cert):
        raise CaError(f"{cert_file(CA)} is not a CA certificate (basicConstraints CA:FALSE)")
    verdict = decide_ca(found, now=now, renew_before=plan.renew_before)
    if verdict.keep:
        return found, "kept", verdict.reason, None
    key = generate_key(plan.key_type)
    cert = issue_ca(key, now=now, validity=plan.ca_validity)
    return Pair(cert, key), "renewed", verdict.reason, found.cert


def _bundle(
    files: Mapping[str, bytes],
    ca: Pair,
    retired: x509.Certificate | None,
    now: datetime,
    *,
    fresh: bool,
) -> bytes:
    """The current CA first, then earlier CAs still valid (a rollover in progress)."""
    existing = files.get(BUNDLE_FILE)
    previous: tuple[x509.Certificate, ...] = ()
    if existing is not None:
        try:
            previous = load_certs(existing)
        except PemError:
            existing = None
    # A brand-new CA means the admin started over: trusting the old roots would defeat that.
    kept = [] if fresh else [*previous, *([retired] if retired is not None else [])]
    wanted = [ca.cert]
    for cert in kept:
        if cert not in wanted and cert.not_valid_after_utc > now:
            wanted.append(cert)
    if existing is not None and list(previous) == wanted:
        return existing
    return b"".join(cert_pem(cert) for cert in wanted)


def _same(files: Mapping[str, bytes], name: str, secret: bool) -> OutFile:
    return OutFile(name, files[name], secret)


def _any(files: Mapping[str, bytes], name: str) -> bool:
    return cert_file(name) in files or key_file(name) in files


def _texts(ips: frozenset[object]) -> frozenset[str]:
    return frozenset(str(ip) for ip in ips)


def _name_change(have: frozenset[str], want: frozenset[str]) -> str:
    parts = []
    if missing := sorted(want - have):
        parts.append(f"lacks {', '.join(missing)}")
    if extra := sorted(have - want):
        parts.append(f"has no longer wanted {', '.join(extra)}")
    return "names changed: " + "; ".join(parts)


def _expiry(left: timedelta, renew_before: timedelta) -> str:
    if left <= timedelta(0):
        return "expired"
    return f"expires in {_days(left)} (within --renew-before {renew_before.days} days)"


def _valid_until(cert: x509.Certificate) -> str:
    return f"valid until {cert.not_valid_after_utc:%Y-%m-%d}"


def _days(span: timedelta) -> str:
    if span >= timedelta(days=2):
        return f"{span.days} days"
    hours = int(span.total_seconds() // 3600)
    return f"{hours} hours" if hours >= 1 else "less than an hour"
