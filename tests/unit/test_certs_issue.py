"""What `python -m certs` issues, and when it keeps or re-issues: pure, with `now` injected."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from certs.issue import (
    CLOCK_SKEW,
    Pair,
    cert_pem,
    common_name_of,
    generate_key,
    issue_ca,
    issue_leaf,
    key_pem,
    key_type_of,
    load_certs,
    names_of,
)
from certs.plan import KeyType, LeafSpec, Plan, PlanError, make_plan, service_names
from certs.renew import (
    BUNDLE_FILE,
    CaError,
    Missing,
    Outcome,
    decide_ca,
    decide_leaf,
    reconcile,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


# ---------------------------------------------------------------- builders


def plan(**flags: object) -> Plan:
    return make_plan(**{"dns": ["localhost"], "ips": ["127.0.0.1"], **flags})  # type: ignore[arg-type]


def spec(name: str, **flags: object) -> LeafSpec:
    return next(s for s in plan(**flags).leaves() if s.name == name)


def authority(*, now: datetime = NOW, days: int = 3650, key_type: KeyType = "ecdsa-p256") -> Pair:
    key = generate_key(key_type)
    return Pair(issue_ca(key, now=now, validity=days * DAY), key)


CA = authority()


def leaf(
    leaf_spec: LeafSpec,
    *,
    ca: Pair = CA,
    now: datetime = NOW,
    days: int = 365,
    key_type: KeyType = "ecdsa-p256",
) -> Pair:
    key = generate_key(key_type)
    return Pair(issue_leaf(leaf_spec, key, ca, now=now, validity=days * DAY), key)


def eku(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def texts(cert: x509.Certificate) -> set[str]:
    dns, ips = names_of(cert)
    return set(dns) | {str(ip) for ip in ips}


def files_of(outcome: Outcome) -> dict[str, bytes]:
    return {f.name: f.data for f in outcome.files}


# ---------------------------------------------------------------- what is issued


@pytest.mark.parametrize(
    ("flags", "name", "expected"),
    [
        pytest.param(
            {},
            "webhook",
            {
                "tessera-webhook",
                "tessera-webhook.tessera-system",
                "tessera-webhook.tessera-system.svc",
                "tessera-webhook.tessera-system.svc.cluster.local",
                "localhost",
                "127.0.0.1",
            },
            id="webhook-defaults",
        ),
        pytest.param(
            {"namespace": "gpu", "extender_service": "ext", "dns": ["Ext.Example.COM."]},
            "extender",
            {*service_names("ext", "gpu"), "ext.example.com", "127.0.0.1"},
            id="extender-own-service-lowercased-dns",
        ),
        pytest.param(
            {"dns": ["localhost", "localhost"], "ips": ["::1", "127.0.0.1", "::1"]},
            "webhook",
            {*service_names("tessera-webhook", "tessera-system"), "localhost", "::1", "127.0.0.1"},
            id="duplicates-once-ipv6",
        ),
        pytest.param({}, "kube-scheduler", set(), id="client-has-no-names"),
    ],
)
def test_certificates_carry_every_name_a_client_may_use(
    flags: dict[str, object], name: str, expected: set[str]
) -> None:
    assert texts(leaf(spec(name, **flags)).cert) == expected


@pytest.mark.parametrize(
    ("name", "eku_oid", "common_name"),
    [
        ("webhook", ExtendedKeyUsageOID.SERVER_AUTH, "tessera-webhook.tessera-system.svc"),
        ("extender", ExtendedKeyUsageOID.SERVER_AUTH, "tessera-extender.tessera-system.svc"),
        ("kube-scheduler", ExtendedKeyUsageOID.CLIENT_AUTH, "system:kube-scheduler"),
    ],
)
def test_serving_certificates_serve_and_the_scheduler_certificate_is_a_client_one(
    name: str, eku_oid: x509.ObjectIdentifier, common_name: str
) -> None:
    cert = leaf(spec(name)).cert
    assert eku(cert) == {eku_oid}
    assert common_name_of(cert) == common_name
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(CA.cert)


def test_ca_may_sign_leaves_only() -> None:
    constraints = CA.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = CA.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert constraints.critical
    assert (constraints.value.ca, constraints.value.path_length) == (True, 0)
    assert (usage.key_cert_sign, usage.crl_sign) == (True, True)
    ski = CA.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = leaf(spec("webhook")).cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    assert aki.value.key_identifier == ski.digest


@pytest.mark.parametrize(
    ("key_type", "check"),
    [
        (
            "ecdsa-p256",
            lambda k: isinstance(k, ec.EllipticCurvePrivateKey) and k.curve.name == "secp256r1",
        ),
        ("rsa-2048", lambda k: isinstance(k, rsa.RSAPrivateKey) and k.key_size == 2048),
    ],
)
def test_key_types(key_type: KeyType, check: Callable[[object], bool]) -> None:
    pair = leaf(spec("webhook"), ca=authority(key_type=key_type), key_type=key_type)
    assert check(pair.key)
    assert key_type_of(pair.key) == key_type
    usage = pair.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    # RSA TLS 1.2 key exchange needs keyEncipherment; ECDSA only signs.
    assert usage.key_encipherment == (key_type == "rsa-2048")


def test_validity_starts_slightly_in_the_past_and_never_outlives_the_ca() -> None:
    cert = leaf(spec("webhook"), days=90).cert
    assert cert.not_valid_before_utc == NOW - CLOCK_SKEW
    assert cert.not_valid_after_utc == NOW + 90 * DAY

    short_ca = authority(days=10)
    assert leaf(spec("webhook"), ca=short_ca).cert.not_valid_after_utc == (
        short_ca.cert.not_valid_after_utc
    )


# ---------------------------------------------------------------- keep or re-issue


@dataclass(frozen=True, slots=True)
class LeafCase:
    id: str
    found: Callable[[], Pair | Missing]
    keep: bool
    reason: str
    now: datetime = NOW
    flags: dict[str, object] | None = None


WEBHOOK = spec("webhook")

LEAF_CASES = [
    LeafCase("fresh", lambda: leaf(WEBHOOK), True, "valid until 2027-03-01"),
    LeafCase("31-days-left", lambda: leaf(WEBHOOK), True, "valid until", now=NOW + 334 * DAY),
    LeafCase("29-days-left", lambda: leaf(WEBHOOK), False, "expires in 29 days", NOW + 336 * DAY),
    LeafCase("hours-left", lambda: leaf(WEBHOOK, days=1), False, "expires in 24 hours"),
    LeafCase("expired", lambda: leaf(WEBHOOK), False, "expired", now=NOW + 400 * DAY),
    LeafCase("missing", lambda: Missing("no certificate yet"), False, "no certificate yet"),
    LeafCase(
        "other-ca", lambda: leaf(WEBHOOK, ca=authority()), False, "not signed by the current CA"
    ),
    LeafCase(
        "new-dns-flag",
        lambda: leaf(WEBHOOK),
        False,
        "names changed: lacks webhook.example.com",
        flags={"dns": ["localhost", "webhook.example.com"]},
    ),
    LeafCase(
        "dropped-ip-flag",
        lambda: leaf(WEBHOOK),
        False,
        "names changed: has no longer wanted 127.0.0.1",
        flags={"ips": []},
    ),
    LeafCase(
        "namespace-moved",
        lambda: leaf(WEBHOOK),
        False,
        "common name is",
        flags={"namespace": "other"},
    ),
    LeafCase("key-type", lambda: leaf(WEBHOOK, key_type="rsa-2048"), False, "key is rsa-2048"),
    LeafCase(
        "client-cert-as-server",
        lambda: leaf(replace(WEBHOOK, usage="client")),
        False,
        "not a server certificate",
    ),
    LeafCase("not-yet-valid", lambda: leaf(WEBHOOK, now=NOW + DAY), False, "not valid before"),
]


@pytest.mark.parametrize("case", LEAF_CASES, ids=lambda c: c.id)
def test_decide_leaf(case: LeafCase) -> None:
    wanted = spec("webhook", **(case.flags or {}))
    verdict = decide_leaf(
        case.found(), wanted, CA.cert, key_type="ecdsa-p256", now=case.now, renew_before=30 * DAY
    )
    assert (verdict.keep, case.reason in verdict.reason) == (case.keep, True), verdict.reason


@pytest.mark.parametrize(
    ("now", "keep"),
    [(NOW, True), (NOW + 3619 * DAY, True), (NOW + 3621 * DAY, False), (NOW + 4000 * DAY, False)],
)
def test_decide_ca_renews_only_near_expiry(now: datetime, keep: bool) -> None:
    assert decide_ca(CA, now=now, renew_before=30 * DAY).keep is keep


@settings(max_examples=25, deadline=None)
@given(
    service=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
    namespace=st.from_regex(r"[a-z][a-z0-9]{0,15}", fullmatch=True),
    dns=st.lists(st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}", fullmatch=True), max_size=3),
    ips=st.lists(st.ip_addresses(), max_size=3),
    days=st.integers(min_value=2, max_value=800),
)
def test_an_issued_certificate_is_kept_until_its_renewal_margin(
    service: str,
    namespace: str,
    dns: list[str],
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    days: int,
) -> None:
    the_plan = make_plan(
        namespace=namespace,
        webhook_service=service,
        dns=dns,
        ips=[str(ip) for ip in ips],
        days=days,
        ca_days=max(days, 3650),
    )
    wanted = the_plan.leaves()[0]
    issued = leaf(wanted, days=days)
    assert texts(issued.cert) == {*wanted.dns_names, *(str(ip) for ip in wanted.ip_addresses)}

    def keep(at: datetime) -> bool:
        return decide_leaf(
            issued, wanted, CA.cert, key_type="ecdsa-p256", now=at,
            renew_before=the_plan.renew_before,
        ).keep  # fmt: skip

    margin_starts = issued.cert.not_valid_after_utc - the_plan.renew_before
    assert keep(NOW)
    assert keep(margin_starts - timedelta(seconds=1))
    assert not keep(margin_starts)


# ---------------------------------------------------------------- a whole run


def test_first_run_creates_everything_with_keys_marked_secret() -> None:
    outcome = reconcile({}, plan(), NOW)
    assert [(r.name, r.action) for r in outcome.reports] == [
        ("ca", "created"),
        ("webhook", "created"),
        ("extender", "created"),
        ("kube-scheduler", "created"),
    ]
    secret = {f.name for f in outcome.files if f.secret}
    assert secret == {"ca.key", "webhook.key", "extender.key", "kube-scheduler.key"}
    files = files_of(outcome)
    assert files[BUNDLE_FILE] == files["ca.crt"] == outcome.ca_bundle


def test_second_run_keeps_every_byte() -> None:
    first = files_of(reconcile({}, plan(), NOW))
    second = reconcile(first, plan(), NOW + 100 * DAY)
    assert {r.action for r in second.reports} == {"kept"}
    assert files_of(second) == first


def test_a_leaf_near_expiry_is_reissued_from_the_same_ca_and_the_rest_kept() -> None:
    first = files_of(reconcile({}, plan(days=40, renew_before_days=5), NOW))
    second = reconcile(first, plan(days=365, renew_before_days=60), NOW)
    assert {r.name: r.action for r in second.reports} == {
        "ca": "kept",
        "webhook": "renewed",
        "extender": "renewed",
        "kube-scheduler": "renewed",
    }
    files = files_of(second)
    assert files["ca.crt"] == first["ca.crt"]
    assert files[BUNDLE_FILE] == first[BUNDLE_FILE]
    ca = load_certs(first["ca.crt"])[0]
    renewed = load_certs(files["webhook.crt"])[0]
    renewed.verify_directly_issued_by(ca)
    assert renewed.not_valid_after_utc == NOW + 365 * DAY


def test_changed_names_reissue_only_the_serving_certificates() -> None:
    first = files_of(reconcile({}, plan(), NOW))
    second = reconcile(first, plan(dns=["localhost", "tessera.example.com"]), NOW)
    assert {r.name: r.action for r in second.reports} == {
        "ca": "kept",
        "webhook": "renewed",
        "extender": "renewed",
        "kube-scheduler": "kept",
    }


def test_a_garbage_leaf_file_is_reissued_with_the_reason() -> None:
    first = files_of(reconcile({}, plan(), NOW))
    second = reconcile({**first, "extender.crt": b"garbage"}, plan(), NOW)
    report = next(r for r in second.reports if r.name == "extender")
    assert (report.action, "not a PEM certificate" in report.reason) == ("renewed", True)


def test_ca_renewal_reissues_every_leaf_and_keeps_the_old_ca_in_the_bundle() -> None:
    first = files_of(reconcile({}, plan(ca_days=400), NOW))
    at = NOW + 380 * DAY
    second = reconcile(first, plan(ca_days=400), at)
    leaves = {r.name: (r.action, r.reason) for r in second.reports if r.name != "ca"}
    assert leaves == dict.fromkeys(
        ("webhook", "extender", "kube-scheduler"), ("renewed", "the CA was renewed")
    )
    files = files_of(second)
    new_ca, old_ca = load_certs(files["ca.crt"])[0], load_certs(first["ca.crt"])[0]
    assert new_ca != old_ca
    assert load_certs(files[BUNDLE_FILE]) == (new_ca, old_ca)
    load_certs(files["webhook.crt"])[0].verify_directly_issued_by(new_ca)

    # Once the old CA has expired, it leaves the bundle.
    third = reconcile(files, plan(ca_days=400), NOW + 401 * DAY)
    assert load_certs(files_of(third)[BUNDLE_FILE]) == (new_ca,)


def test_a_new_ca_after_deleting_the_old_one_trusts_only_itself() -> None:
    first = files_of(reconcile({}, plan(), NOW))
    without_ca = {k: v for k, v in first.items() if k not in {"ca.crt", "ca.key"}}
    second = files_of(reconcile(without_ca, plan(), NOW))
    assert len(load_certs(second[BUNDLE_FILE])) == 1
    assert second[BUNDLE_FILE] == second["ca.crt"] != first["ca.crt"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: {**f, "ca.key": key_pem(generate_key("ecdsa-p256"))}, "does not match"),
        (lambda f: {k: v for k, v in f.items() if k != "ca.key"}, "ca.key is missing"),
        (lambda f: {**f, "ca.crt": b"not pem"}, "not a PEM certificate"),
        (lambda f: {**f, "ca.crt": f["webhook.crt"], "ca.key": f["webhook.key"]}, "not a CA"),
    ],
)
def test_an_unusable_ca_is_an_error_not_a_silent_replacement(
    damage: Callable[[dict[str, bytes]], dict[str, bytes]], message: str
) -> None:
    first = files_of(reconcile({}, plan(), NOW))
    with pytest.raises(CaError, match=message):
        reconcile(damage(first), plan(), NOW)


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ips": ["300.1.1.1"]}, "--ip '300.1.1.1' is not an IPv4 or IPv6 address"),
        ({"dns": ["bad_name"]}, "--dns 'bad_name' is not a valid DNS name"),
        ({"dns": ["a..b"]}, "--dns 'a..b' is not a valid DNS name"),
        ({"dns": ["10.0.0.1"]}, "--dns '10.0.0.1' is an IP address: give it with --ip"),
        ({"namespace": "Tessera"}, "--namespace 'Tessera' is not a valid name"),
        ({"webhook_service": "-x"}, "--webhook-service '-x' is not a valid name"),
        ({"days": 0}, "--days must be at least 1"),
        ({"days": 10, "renew_before_days": 10}, "--renew-before (10) must be shorter than --days"),
        ({"renew_before_days": -1}, "--renew-before must not be negative"),
        ({"days": 4000}, "--days (4000) must not exceed --ca-days (3650)"),
        ({"key_type": "dsa"}, "--key-type 'dsa' is not one of ecdsa-p256, rsa-2048"),
    ],
)
def test_bad_flags_name_the_flag(flags: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as raised:
        plan(**flags)
    assert message in str(raised.value)


@pytest.mark.parametrize(("days", "renew_before"), [(365, 30), (90, 30), (30, 10), (1, 0)])
def test_default_renewal_margin_fits_short_lifetimes(days: int, renew_before: int) -> None:
    assert plan(days=days).renew_before == renew_before * DAY


def test_wildcard_dns_names_are_accepted() -> None:
    assert plan(dns=["*.tessera.example.com"]).dns == ("*.tessera.example.com",)


def test_pem_round_trip() -> None:
    assert load_certs(cert_pem(CA.cert) + cert_pem(CA.cert)) == (CA.cert, CA.cert)
