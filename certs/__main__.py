"""``python -m certs``: make or renew the CA and the certificates, print the caBundle.

Layer: ROOT. Parses flags, reads the system clock once, and wires ``certs.store`` to
``certs.renew``. Must hold no certificate logic of its own. stdout carries only the
caBundle (so ``$(python -m certs ...)`` works); what happened goes to stderr. Errors are
one line and an exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from certs.manifests import KIND
from certs.plan import KEY_TYPES, Plan, PlanError, make_plan
from certs.renew import BUNDLE_FILE, CaError, file_names, reconcile
from certs.store import StoreError, patch_manifests, read_files, write_files
from cluster.clock import SystemClock

PROG = "python -m certs"

EPILOG = f"""\
files written to --out:
  ca.crt ca.key               the CA (kept across runs; renewed only near its expiry)
  {BUNDLE_FILE}               the caBundle: the CA, plus the previous CA during a rollover
  webhook.crt webhook.key     the webhook's serving certificate
  extender.crt extender.key   the extender's serving certificate
  kube-scheduler.crt .key     kube-scheduler's client certificate (for the extender's mTLS)
  Private keys are 0600. Files are replaced atomically, and only when they change.

examples:
  # local run: servers on localhost
  {PROG} --out certs-out --dns localhost --ip 127.0.0.1

  # cluster install: also write the caBundle into manifests/
  {PROG} --out certs-out --patch-manifests

  # from cron: re-issue whatever expires within 60 days, keep the rest
  {PROG} --out certs-out --renew-before 60 --patch-manifests

  # caBundle into a shell variable
  CA_BUNDLE=$({PROG} --out certs-out)

When the CA itself is renewed the caBundle changes (it then lists the new and the old CA):
apply the patched webhook configuration, then the new Secrets.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Create (or renew) a CA, serving certificates for the Tessera webhook and\n"
            "extender, and a client certificate for kube-scheduler; print the base64\n"
            "caBundle. Running it again changes nothing until a certificate nears expiry\n"
            "or the flags ask for different names."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    parser.add_argument(
        "--namespace", default="tessera-system", help="namespace of both Services (%(default)s)"
    )
    parser.add_argument(
        "--webhook-service", default="tessera-webhook", help="webhook Service name (%(default)s)"
    )
    parser.add_argument(
        "--extender-service",
        default="tessera-extender",
        help="extender Service name (%(default)s)",
    )
    parser.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name for both serving certificates (repeatable), e.g. localhost",
    )
    parser.add_argument(
        "--ip",
        action="append",
        default=[],
        metavar="ADDR",
        help="extra IP address for both serving certificates (repeatable), e.g. 127.0.0.1",
    )
    parser.add_argument(
        "--days", type=int, default=365, help="validity of issued certificates (%(default)s)"
    )
    parser.add_argument(
        "--ca-days", type=int, default=3650, help="validity of a new CA (%(default)s)"
    )
    parser.add_argument(
        "--renew-before",
        type=int,
        metavar="DAYS",
        help="re-issue certificates that expire within this many days"
        " (30, or a third of --days if that is shorter)",
    )
    parser.add_argument(
        "--key-type",
        choices=KEY_TYPES,
        default="ecdsa-p256",
        help="key type of newly issued certificates (%(default)s)",
    )
    parser.add_argument(
        "--patch-manifests",
        nargs="?",
        const=Path("manifests"),
        type=Path,
        metavar="DIR",
        help=f"write the caBundle into every {KIND} in the YAML files under DIR"
        " (default DIR: manifests/)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        plan = make_plan(
            namespace=args.namespace,
            webhook_service=args.webhook_service,
            extender_service=args.extender_service,
            dns=args.dns,
            ips=args.ip,
            days=args.days,
            ca_days=args.ca_days,
            renew_before_days=args.renew_before,
            key_type=args.key_type,
        )
    except PlanError as exc:
        parser.error(str(exc))
    try:
        bundle = _run(args.out, plan, args.patch_manifests)
    except (CaError, StoreError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(bundle)
    return 0


def _run(out: Path, plan: Plan, manifests: Path | None) -> str:
    existing = read_files(out, file_names(plan))
    outcome = reconcile(existing, plan, SystemClock().now())
    written = write_files(out, outcome.files, existing)
    for report in outcome.reports:
        until = "" if report.action == "kept" else f"; valid until {report.not_after:%Y-%m-%d}"
        _say(f"{report.name:<15} {report.action:<8} {report.reason}{until}")
    for name in written.tightened:
        _say(f"{name}: was readable by others, now 0600")
    _say(f"{len(written.written)} file(s) written in {out}")
    if manifests is not None:
        patched = patch_manifests(manifests, outcome.ca_bundle_b64)
        for note in patched.notes:
            _say(note)
        _say(
            f"caBundle set in {patched.webhooks} webhook(s) under {manifests};"
            f" {len(patched.changed)} file(s) changed"
        )
        if patched.webhooks == 0:
            _say(f"warning: no {KIND} found under {manifests}")
    return outcome.ca_bundle_b64


def _say(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
