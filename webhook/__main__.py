"""``python -m webhook``: serve the admission webhook over TLS.

Layer: ROOT. The only module that reads the environment: every flag has a
``TESSERA_WEBHOOK_<FLAG>`` variable. Exits with one line (no traceback) when the
settings or the certificate files are wrong; stops cleanly on SIGTERM, answering the
reviews under way.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cluster import logs
from cluster.files import ObjectFileError
from server import serving
from server.cli import env_bool, env_value, one_line
from server.serving_settings import add_serving_flags
from server.tls import CertReloader, TLSConfigError
from webhook.app import create_app
from webhook.settings import WebhookSettings

log = logging.getLogger("webhook")

EXAMPLES = """\
examples:
  python -m webhook --tls-cert certs-out/webhook.crt --tls-key certs-out/webhook.key \\
      --policy-file manifests/examples/queues.yaml
  python -m webhook --tls-cert /tls/tls.crt --tls-key /tls/tls.key          # in-cluster
"""


ENV_PREFIX = "TESSERA_WEBHOOK_"


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> WebhookSettings:
    parser = argparse.ArgumentParser(
        prog="python -m webhook",
        description="Tessera's mutating admission webhook (HTTPS only).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    def flag(name: str, **kwargs: Any) -> None:
        parser.add_argument(f"--{name}", default=env_value(environ, ENV_PREFIX, name), **kwargs)

    flag("host", help="address to listen on (default 0.0.0.0)")
    flag("port", type=int, help="port to listen on (default 8443)")
    flag(
        "tls-cert",
        required=env_value(environ, ENV_PREFIX, "tls-cert") is None,
        help="serving certificate",
    )
    flag(
        "tls-key",
        required=env_value(environ, ENV_PREFIX, "tls-key") is None,
        help="its private key",
    )
    flag("policy-file", help="Kueue objects from this YAML/JSON file instead of a watch")
    flag("kubeconfig", help="watch Kueue objects through this kubeconfig (else in-cluster)")
    flag("scheduler-name", help="scheduler profile written into pod templates")
    flag(
        "managed-namespaces",
        help="comma-separated namespaces where GPU work without a queue is denied (* = all)",
    )
    add_serving_flags(flag)
    flag(
        "request-timeout",
        dest="request_timeout_s",
        type=float,
        help="deadline in seconds of a review without ?timeout= (kube-apiserver sends one; "
        "default 10)",
    )
    flag(
        "job-controller-usernames",
        help="comma-separated users whose pods owned by an existing Job are let through "
        "unchanged (default: the Job controller's; empty: any user)",
    )
    flag(
        "jobset-controller-usernames",
        help="likewise for Jobs owned by an existing JobSet (default: the JobSet "
        "controller's; empty: any user)",
    )
    flag("log-level", help="DEBUG, INFO, WARNING (default INFO)")
    parser.add_argument(
        "--log-json",
        action="store_true",
        default=bool(env_bool(environ, ENV_PREFIX, "log-json", parser)),
    )
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if v is not None}
    if "managed_namespaces" in values:
        values["managed_namespaces"] = frozenset(_names(values["managed_namespaces"]))
    for usernames in ("job_controller_usernames", "jobset_controller_usernames"):
        if usernames in values:
            values[usernames] = _names(values[usernames])
    try:
        return WebhookSettings(**values)
    except ValidationError as exc:
        parser.exit(2, f"python -m webhook: error: {one_line(exc)}\n")


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list; empty for an empty text."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def main(argv: Sequence[str] | None = None) -> int:
    environ = dict(os.environ)
    settings = parse_settings(sys.argv[1:] if argv is None else argv, environ)
    logs.configure(json=settings.log_json, level=settings.log_level)
    assert settings.tls_cert is not None
    assert settings.tls_key is not None
    try:
        reloader = CertReloader(
            Path(settings.tls_cert),
            Path(settings.tls_key),
            interval=settings.cert_reload_interval_s,
        )
    except TLSConfigError as exc:
        print(f"python -m webhook: cannot serve TLS: {exc}", file=sys.stderr)
        return 1
    return serving.run(
        "python -m webhook",
        _serve(settings, reloader, environ),
        fatal=(ObjectFileError, OSError),
    )


async def _serve(
    settings: WebhookSettings, reloader: CertReloader, environ: Mapping[str, str]
) -> None:
    # built inside the loop: a policy file is read here, Kueue watches start with the app
    app = create_app(settings, environ=environ)
    await serving.serve(app, settings.host, settings.port, reloader, {}, settings=settings)


if __name__ == "__main__":
    sys.exit(main())
