"""``python -m loadtest``: the performance engineer's tool and the project's demo.

Layer: ROOT. The only place in the load test that reads the environment
(``TESSERA_DATA``: the folder with the shared traces; ``TESSERA_DEMO_SHORT=1``: ``demo``
in its short form, so that CI can run ``make demo`` quickly), and hands each mode to
what runs it; the flags are ``loadtest.cli``'s. Subcommands: ``demo`` (``make demo``),
``latency``, ``soak`` (``loadtest.demo``), ``placement`` (the FGD method,
``loadtest.placement``), ``reservations`` (gangs with and without reservations,
``loadtest.reservations``), ``sched-perf`` (the real kube-scheduler with and without
the extender, ``loadtest.schedperf``), ``selfcheck`` (the cluster-model check without servers), and
``bench-webhook`` / ``bench-extender`` / ``overload``, which hand their arguments to
``loadtest.bench.webhook.main`` (``loadtest.bench.against_kueue.main`` with
``--against``) / ``loadtest.bench.extender.main`` / ``loadtest.bench.overload.main``
unchanged. Must not decide anything a mode decides.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType

from cluster import jsonio
from cluster.clock import SystemClock
from cluster.kube import KubeError
from loadtest import cli
from loadtest.demo import modes as demo
from loadtest.demo import real as real_demo
from loadtest.demo import selfcheck
from loadtest.inputs.traces import DEFAULT_DATA_DIR, TraceMissing
from loadtest.report.placement_page import placement_page
from loadtest.sim.remote_pods import RemoteClusterError


def _placement_html(json_path: Path) -> None:
    """The FGD figure (allocation vs arrived load per policy) next to the JSON."""
    try:
        data = jsonio.loads(json_path.read_bytes())
        page = placement_page(data, "Tessera placement quality (FGD method, openb)")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"no placement HTML: {json_path}: {exc}", file=sys.stderr)
        return
    html_path = json_path.with_suffix(".html")
    html_path.write_text(page, encoding="utf-8")
    print(f"report: {html_path}")


def _terminate(signum: int, frame: FrameType | None) -> None:
    # the stack's processes are stopped on the way out, as on Ctrl-C
    raise KeyboardInterrupt


def _real_assets() -> demo.Assets | None:
    from loadtest.stack.controlplane import (  # noqa: PLC0415 - only for --real
        BinariesUnavailableError,
        find_binaries,
        find_crds,
        find_jobset,
        find_kueue,
    )

    try:
        return demo.Assets(
            find_binaries(progress=sys.stderr),
            find_crds(progress=sys.stderr),
            find_kueue(progress=sys.stderr),
            find_jobset(progress=sys.stderr),
        )
    except (BinariesUnavailableError, RuntimeError) as exc:
        print(
            "python -m loadtest demo --real: the real stack's binaries (Kubernetes v1.36.3, "
            "etcd, Kueue v0.17.0, JobSet v0.11.1 and their CRDs) are missing and could not be "
            "built. Get them with `make e2e-assets` (needs Go >= 1.26; a cold build takes "
            "several minutes and is cached in ~/.cache/tessera), or set KUBEBUILDER_ASSETS to "
            "a folder holding etcd, "
            f"kube-apiserver, kube-scheduler, kube-controller-manager and kubectl.\n{exc}",
            file=sys.stderr,
        )
        return None


def _demo_real(args: argparse.Namespace, clock: SystemClock) -> int:
    assets = _real_assets()
    if assets is None:
        return 2
    modes = real_demo.TOPOLOGIES if args.topology == "both" else (args.topology,)
    specs = [real_demo.real_spec(short=args.short, seed=args.seed, topology=m) for m in modes]
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        outcomes = demo.execute_real(
            specs,
            assets,
            args.out,
            clock=clock,
            say=print,
            live=demo.live_line(),
            keep_dir=args.keep,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not all(o.ok for o in outcomes):
        print("error: the run's checks failed (see above)", file=sys.stderr)
        return 1
    return 0


def _passthrough(argv: list[str]) -> int | None:
    """The modes with flags of their own (``placement``, the benchmarks): their ``main``
    gets the rest of ``argv``; ``None`` when ``argv`` names none of them."""
    if argv[:1] == ["placement"] or (
        len(argv) > 2 and argv[0] == "--data" and argv[2] == "placement"
    ):
        return _placement(argv)
    if argv[:1] == ["reservations"] or (
        len(argv) > 2 and argv[0] == "--data" and argv[2] == "reservations"
    ):
        from loadtest.reservations import study  # noqa: PLC0415 - heavy, only for this mode

        rest = argv[argv.index("reservations") + 1 :]
        return study.main(["--data", argv[1], *rest] if argv[0] == "--data" else rest)
    if argv[:1] == ["sched-perf"]:
        return _sched_perf(argv[1:])
    if argv[:1] in (["bench-webhook"], ["bench-extender"], ["overload"]):
        # The benchmarks keep their own flags; this is only a way in.
        if argv[0] == "bench-webhook" and any(a.startswith("--against") for a in argv):
            from loadtest.bench.against_kueue import main as bench  # noqa: PLC0415 - heavy
        elif argv[0] == "bench-webhook":
            from loadtest.bench.webhook import main as bench  # noqa: PLC0415 - heavy
        elif argv[0] == "bench-extender":
            from loadtest.bench.extender import main as bench  # noqa: PLC0415 - heavy
        else:
            from loadtest.bench.overload import main as bench  # noqa: PLC0415 - heavy
        return bench(argv[1:])
    return None


def _sched_perf(argv: list[str]) -> int:
    """The real kube-scheduler with and without the extender; its page beside the JSON."""
    from loadtest.report.schedperf_page import schedperf_page  # noqa: PLC0415 - only here
    from loadtest.schedperf import command  # noqa: PLC0415 - heavy, only for this mode

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        code = command.main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0 or any(a in ("-h", "--help") for a in argv):
        return code
    json_path = command.DEFAULT_JSON
    if "--json" in argv:
        json_path = Path(argv[argv.index("--json") + 1])
    try:
        page = schedperf_page(
            jsonio.loads(json_path.read_bytes()),
            "Tessera: kube-scheduler with and without the extender (sched-perf)",
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"no sched-perf HTML: {json_path}: {exc}", file=sys.stderr)
        return code
    html_path = json_path.with_suffix(".html")
    html_path.write_text(page, encoding="utf-8")
    print(f"report: {html_path}")
    return code


def _placement(argv: list[str]) -> int:
    from loadtest.placement import study  # noqa: PLC0415 - heavy, only for this mode

    rest = argv[argv.index("placement") + 1 :]
    if argv[0] == "--data":
        rest = ["--data", argv[1], *rest]
    code = study.main(rest)
    if code == 0 and "--json" in rest:
        _placement_html(Path(rest[rest.index("--json") + 1]))
    return code


def _selfcheck(args: argparse.Namespace, clock: SystemClock) -> int:
    found = selfcheck.run(clock, args.data, max_pods=args.max_pods)
    print("\n".join(found.lines()))
    if found.placed == 0:
        print("error: nothing was placed", file=sys.stderr)
        return 1
    return 0


def _simulated(args: argparse.Namespace, clock: SystemClock) -> int:
    """``demo``, ``latency`` and ``soak`` on the simulated cluster."""
    if args.command == "demo":
        base = demo.demo_spec(short=args.short, seed=args.seed)
        spec = base if args.short else cli.run_spec(args, base)
    else:
        spec = cli.run_spec(args, demo.demo_spec())
    if args.command == "latency" and args.verb_rate > 0:
        spec = replace(spec, verb_rate=args.verb_rate, verb_duration_s=args.verb_duration)
    try:
        out = demo.execute(
            args.command, spec, args.out, clock=clock, say=print, live=demo.live_line()
        )
    except (TraceMissing, RemoteClusterError, KubeError) as exc:
        print(f"python -m loadtest: {exc}", file=sys.stderr)
        return 2
    failed = not out.ok
    if args.command == "soak":
        for name, rss in out.data["rss"].items():
            if rss["growth_second_half_mib"] > args.max_rss_growth_mib:
                print(
                    f"soak: {name} RSS grew {rss['growth_second_half_mib']:.1f} MiB "
                    "in the second half"
                )
                failed = True
    if failed:
        print("error: the run's checks failed (see above)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    code = _passthrough(argv)
    if code is not None:
        return code
    parser = cli.build_parser(
        data=Path(os.environ.get("TESSERA_DATA", DEFAULT_DATA_DIR)),
        short=os.environ.get("TESSERA_DEMO_SHORT", "") not in ("", "0", "false"),
    )
    args = parser.parse_args(argv)
    clock = SystemClock()
    if args.command == "selfcheck":
        return _selfcheck(args, clock)
    if args.command == "demo" and args.real:
        return _demo_real(args, clock)
    return _simulated(args, clock)


if __name__ == "__main__":
    sys.exit(main())
