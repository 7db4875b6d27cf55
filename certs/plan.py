"""What the admin asked for: the validated inputs of one ``python -m certs`` run.

Layer: PURE. Turns flag values into a frozen ``Plan`` and the ``LeafSpec`` of every
certificate to hold; rejects bad values with a ``PlanError`` whose message names the flag.
Must not read files, the clock or the environment, and must not build any certificate.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeVar, get_args

KeyType = Literal["ecdsa-p256", "rsa-2048"]
KEY_TYPES: tuple[KeyType, ...] = get_args(KeyType)
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Usage = Literal["server", "client"]

KUBE_SCHEDULER_CN = "system:kube-scheduler"
"""kube-scheduler's own identity in Kubernetes; the extender may check it on /bind."""
CLUSTER_DOMAIN = "cluster.local"

_T = TypeVar("_T")
_KEY_TYPE_BY_NAME: dict[str, KeyType] = {k: k for k in KEY_TYPES}
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PlanError(ValueError):
    """A flag value that cannot work; the message names the flag."""


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """One certificate signed by the CA; ``name`` is also its file stem in the output folder."""

    name: str
    common_name: str
    usage: Usage
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[IpAddress, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    namespace: str = "tessera-system"
    webhook_service: str = "tessera-webhook"
    extender_service: str = "tessera-extender"
    dns: tuple[str, ...] = ()
    ips: tuple[IpAddress, ...] = ()
    validity: timedelta = timedelta(days=365)
    ca_validity: timedelta = timedelta(days=3650)
    renew_before: timedelta = timedelta(days=30)
    key_type: KeyType = "ecdsa-p256"

    def leaves(self) -> tuple[LeafSpec, ...]:
        """The webhook's and extender's serving certificates, kube-scheduler's client one."""
        return (
            self._serving("webhook", self.webhook_service),
            self._serving("extender", self.extender_service),
            LeafSpec(name="kube-scheduler", common_name=KUBE_SCHEDULER_CN, usage="client"),
        )

    def _serving(self, name: str, service: str) -> LeafSpec:
        names = _unique((*service_names(service, self.namespace), *self.dns))
        return LeafSpec(
            name=name,
            common_name=f"{service}.{self.namespace}.svc",
            usage="server",
            dns_names=names,
            ip_addresses=_unique(self.ips),
        )


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """Every name a pod or kube-apiserver may use to reach a Service."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
    )


def dns_label(value: str, flag: str) -> str:
    """A Kubernetes name (RFC 1123 label): what Services and Namespaces are called."""
    if not _LABEL.fullmatch(value):
        raise PlanError(
            f"{flag} {value!r} is not a valid name: lower-case letters, digits and '-',"
            " at most 63 characters, starting and ending with a letter or digit"
        )
    return value


def dns_name(value: str, flag: str = "--dns") -> str:
    """A host name for a SAN; a leading ``*.`` wildcard is allowed. Lower-cased."""
    name = value.strip().lower().removesuffix(".")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        raise PlanError(f"{flag} {value!r} is an IP address: give it with --ip")
    labels = name.split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise PlanError(f"{flag} {value!r} is not a valid DNS name")
    return name


def ip_address(value: str, flag: str = "--ip") -> IpAddress:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        raise PlanError(f"{flag} {value!r} is not an IPv4 or IPv6 address") from None


def make_plan(
    *,
    namespace: str = "tessera-system",
    webhook_service: str = "tessera-webhook",
    extender_service: str = "tessera-extender",
    dns: Iterable[str] = (),
    ips: Iterable[str] = (),
    days: int = 365,
    ca_days: int = 3650,
    renew_before_days: int | None = None,
    key_type: str = "ecdsa-p256",
) -> Plan:
    """Validate flag values together; each error names the flag to fix.

    Without ``renew_before_days``, certificates are renewed 30 days before expiry, or a
    third of ``days`` before it when they are shorter-lived than 90 days.
    """
    if renew_before_days is None:
        renew_before_days = min(30, days // 3)
    kind = _KEY_TYPE_BY_NAME.get(key_type)
    if kind is None:
        raise PlanError(f"--key-type {key_type!r} is not one of {', '.join(KEY_TYPES)}")
    if days < 1:
        raise PlanError(f"--days must be at least 1, not {days}")
    if ca_days < 1:
        raise PlanError(f"--ca-days must be at least 1, not {ca_days}")
    if renew_before_days < 0:
        raise PlanError(f"--renew-before must not be negative, not {renew_before_days}")
    # A certificate issued for no longer than the renewal margin would be re-issued by
    # every run: the tool would never settle, so refuse instead of churning.
    if renew_before_days >= days:
        raise PlanError(
            f"--renew-before ({renew_before_days}) must be shorter than --days ({days}),"
            " or every run would re-issue the certificates"
        )
    if renew_before_days >= ca_days:
        raise PlanError(
            f"--renew-before ({renew_before_days}) must be shorter than --ca-days ({ca_days}),"
            " or every run would replace the CA"
        )
    if days > ca_days:
        raise PlanError(f"--days ({days}) must not exceed --ca-days ({ca_days})")
    return Plan(
        namespace=dns_label(namespace, "--namespace"),
        webhook_service=dns_label(webhook_service, "--webhook-service"),
        extender_service=dns_label(extender_service, "--extender-service"),
        dns=_unique(dns_name(d) for d in dns),
        ips=_unique(ip_address(i) for i in ips),
        validity=timedelta(days=days),
        ca_validity=timedelta(days=ca_days),
        renew_before=timedelta(days=renew_before_days),
        key_type=kind,
    )


def _unique(values: Iterable[_T]) -> tuple[_T, ...]:
    return tuple(dict.fromkeys(values))
