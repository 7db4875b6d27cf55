"""``python -m extender``: serve the scheduler extender to kube-scheduler.

Layer: ROOT. The only module that reads the environment: every flag has a
``TESSERA_EXTENDER_<FLAG>`` variable (switches take true/false). Must not decide
anything: it parses, builds the app and serves it. Exits with one line (no traceback)
when the settings, the certificate files, the cluster file or the API configuration are
wrong; stops cleanly on SIGTERM, finishing the binds under way.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cluster import logs
from cluster.files import ObjectFileError
from cluster.kube import KubeError
from extender.app import create_app
from extender.settings import DEFAULT_LEVELS, ExtenderSettings
from server import serving
from server.cli import env_bool, env_value, one_line
from server.serving_settings import add_serving_flags
from server.tls import CertReloader, TLSConfigError

log = logging.getLogger("extender")

PROG = "python -m extender"
EXAMPLES = """\
examples:
  python -m extender --cluster-file cluster.yaml           # standalone, on 127.0.0.1:8888
  python -m extender --kubeconfig ~/.kube/config --topology-levels \\
      block=example.com/block,rack=example.com/rack,hostname=kubernetes.io/hostname
  python -m extender --tls-cert /tls/tls.crt --tls-key /tls/tls.key \\
      --client-ca /tls/ca.crt                              # in-cluster, mutual TLS
"""
ENV_PREFIX = "TESSERA_EXTENDER_"


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> ExtenderSettings:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tessera's GPU-topology-aware kube-scheduler extender.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    def flag(name: str, **kwargs: Any) -> None:
        parser.add_argument(f"--{name}", default=env_value(environ, ENV_PREFIX, name), **kwargs)

    def switch(name: str, help: str) -> None:
        parser.add_argument(
            f"--{name}",
            action=argparse.BooleanOptionalAction,
            default=env_bool(environ, ENV_PREFIX, name, parser),
            help=help,
        )

    flag("host", help="address to listen on (default 0.0.0.0 with TLS, 127.0.0.1 without)")
    flag("port", type=int, help="port to listen on (default 8888)")
    flag("tls-cert", help="serving certificate (HTTPS)")
    flag("tls-key", help="its private key")
    flag("client-ca", help="require client certificates signed by this CA (kube-scheduler's)")
    switch("insecure-bind-any", "serve plain HTTP on a non-loopback address anyway")
    flag("cluster-file", help="nodes and pods from this file (kubectl get -o yaml); no API")
    flag("kubeconfig", help="watch and bind through this kubeconfig (default: in-cluster)")
    _placement_flags(flag, switch)
    _reservation_flags(flag)
    flag("assume-ttl", dest="assume_ttl_s", type=float, help="seconds a bind stays assumed")
    flag("bind-timeout", dest="bind_timeout_s", type=float, help="API budget of one bind (s)")
    add_serving_flags(flag)
    _cache_flags(flag)
    flag("log-level", help="DEBUG, INFO, WARNING (default INFO)")
    switch("log-json", "log one JSON object per line")
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return ExtenderSettings(**values)
    except ValidationError as exc:
        parser.exit(2, f"{PROG}: error: {one_line(exc)}\n")


Flag = Callable[..., None]
"""Adds ``--<name>`` with its ``TESSERA_EXTENDER_<NAME>`` default (argparse keywords)."""
Switch = Callable[[str, str], None]
"""Adds ``--<name>``/``--no-<name>`` with its environment default and a help text."""


def _placement_flags(flag: Flag, switch: Switch) -> None:
    """What shapes placement: topology, scoring weights, islands, the pod mix, and
    whether ``/filter`` chooses the node."""
    flag("topology-levels", help=f"name=node-label pairs, widest first (default {DEFAULT_LEVELS})")
    flag("weight-packing", type=float, help="weight of fragmentation-aware packing")
    flag("weight-island-fit", type=float, help="weight of NVLink island best fit")
    flag("weight-gang-locality", type=float, help="weight of gang members kept together")
    switch("strict-islands", "a pod that fits in one NVLink island must get one (default on)")
    flag(
        "cpu-stranding",
        type=float,
        help="0..1: how much of a free GPU that its node's CPU can no longer serve counts as "
        "a fragment for packing (default 0.2)",
    )
    flag(
        "pod-mix",
        help="the pod sizes packing keeps GPUs usable for: 'learned' from the GPU pods in the "
        "cache (their GPUs, CPU and products; the built-in mix until there is one) or "
        "'default', the built-in mix (default learned)",
    )
    flag(
        "pod-mix-interval",
        dest="pod_mix_interval_s",
        type=float,
        help="seconds between two countings of the learned pod mix (default 60)",
    )
    switch(
        "choose-in-filter",
        "/filter names only the node a pod should go to (unless the pod states a preferred "
        "affinity or a ScheduleAnyway spread), so kube-scheduler binds it there without "
        "scoring or calling /prioritize (default off)",
    )


def _reservation_flags(flag: Flag) -> None:
    """How waiting gangs hold nodes (``extender.holds``)."""
    flag(
        "max-reservations",
        type=int,
        help="waiting gangs that hold a reservation at once, the higher priority first, then "
        "the oldest (default 4; 0: no reservations)",
    )
    flag(
        "reservation-interval",
        dest="reservation_interval_s",
        type=float,
        help="seconds between two plans of the reservations at most (default 10)",
    )
    flag(
        "requeue-grace",
        dest="requeue_grace_s",
        type=float,
        help="seconds a gang whose pods are gone (requeued by Kueue, or deleted) keeps its "
        "reservation (default 180)",
    )
    flag(
        "reservation-namespace",
        help="namespace of the Leases that record reservations (default tessera-system)",
    )


def _cache_flags(flag: Flag) -> None:
    """How long an answer may take, how old the cache may be, and what is kept for
    ``tessera why``."""
    flag(
        "request-timeout",
        dest="request_timeout_s",
        type=float,
        help="seconds kube-scheduler waits for an answer: the extender's httpTimeout (default 5)",
    )
    flag(
        "max-cache-age",
        dest="max_cache_age_s",
        type=float,
        help="seconds since kube-apiserver was last heard on the node or pod watch before "
        "the cache is stale: not ready, and no filter or bind from it (default 30; 0: never)",
    )
    flag(
        "reasons-kept",
        type=int,
        help="pods whose last /filter reasons GET /debug/reasons (on the metrics listener) "
        "can show, for `tessera why` (default 2048; 0: none)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    environ = dict(os.environ)
    settings = parse_settings(sys.argv[1:] if argv is None else argv, environ)
    logs.configure(json=settings.log_json, level=settings.log_level)
    reloader = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        try:
            reloader = CertReloader(
                Path(settings.tls_cert),
                Path(settings.tls_key),
                client_ca=settings.client_ca,
                interval=settings.cert_reload_interval_s,
            )
        except TLSConfigError as exc:
            print(f"{PROG}: cannot serve TLS: {exc}", file=sys.stderr)
            return 1
    return serving.run(
        PROG, _serve(settings, reloader, environ), fatal=(ObjectFileError, KubeError, OSError)
    )


async def _serve(
    settings: ExtenderSettings, reloader: CertReloader | None, environ: Mapping[str, str]
) -> None:
    # built inside the loop: a cluster file is loaded here, watches start with the app
    app = create_app(settings, environ=environ)
    describe = {
        "mutual_tls": settings.client_ca is not None,
        "source": str(settings.cluster_file or settings.kubeconfig or "in-cluster"),
    }
    await serving.serve(
        app, settings.listen_host, settings.port, reloader, describe, settings=settings
    )


if __name__ == "__main__":
    sys.exit(main())
