"""The flags of ``python -m loadtest``'s modes, and the run they describe.

Layer: ROOT (argument parsing only; ``__main__`` reads the environment and hands its
defaults in). Builds the parser of every mode and turns the simulated modes' flags into a
``RunSpec``; must not start, run or print anything.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeAlias

from loadtest.demo import modes as demo
from loadtest.demo import real as real_demo
from loadtest.inputs.fleet import FleetSpec, StreamSpec
from loadtest.sim import scenario

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXAMPLES = """\
examples:
  python -m loadtest demo                       # make demo: both servers, 64 HGX nodes, ~1 min
  python -m loadtest demo --short               # the same in ~15 s (CI)
  python -m loadtest demo --real                # the real control plane, Kueue, fake nodes
  python -m loadtest demo --real --topology both   # topology mode A and mode B, side by side
  python -m loadtest latency --rate 100 --duration 30 --nodes 256
  python -m loadtest soak --duration 600 --max-rss-growth-mib 40
  python -m loadtest latency --trace openb-default --rate 50 --duration 20
  python -m loadtest latency --nodes spot-v2026 --rate 100 --duration 30   # 4,278 nodes
  python -m loadtest latency --nodes spot-v2026 --node-limit 1000
  python -m loadtest latency --webhook-url https://tessera-webhook.example:443 \\
      --extender-url https://tessera-extender.example:8888 --ca ca.crt \\
      --client-cert kube-scheduler.crt --client-key kube-scheduler.key \\
      --kubeconfig test-cluster.kubeconfig --namespace tessera-loadtest
  python -m loadtest placement --quick          # FGD-style placement quality on openb
  python -m loadtest reservations --json resv.json   # gangs with and without reservations
  python -m loadtest sched-perf --nodes 1000 --pods 2000 --repeats 3   # the real \
kube-scheduler with and without the extender (loadtest.schedperf)
  python -m loadtest selfcheck                  # the cluster model alone, no servers
  python -m loadtest bench-webhook --help       # the webhook benchmark (loadtest.bench.webhook)
  python -m loadtest bench-webhook --against kueue   # side by side with Kueue's webhook
  python -m loadtest bench-extender --help      # the extender benchmark (loadtest.bench.extender)
  python -m loadtest overload --server webhook  # 1x, 2x, 3x the sustained rate \
(loadtest.bench.overload)

Reports go to reports/<mode>.json and reports/<mode>.html (--out to change).
"""


NODES_HELP = """\
N synthetic HGX nodes (default %(default)s), or a real node list from --data:
spot-v2026 (Alibaba spot GPU v2026, 4,278 nodes) or openb (Alibaba openb GPU nodes),
under the synthetic job stream. A node list gives each node its GPU model (as the GFD
product label), GPU count and CPU cores; memory 8 GiB per core where the file has none;
one NVLink island only on 8-GPU A100-SXM4/A800-SXM4/H800 boards, no annotation
(one island, the extender's default) elsewhere. The lists have no topology: racks and
blocks are SYNTHETIC (per GPU model in file order, 4 nodes a rack, 4 racks a block) so
that the stream's rack-constrained gangs have racks; their placement quality says
nothing about the real machine rooms. Queues: one flavor per GPU model, each team its
share of every model, the examples' LocalQueues."""


def parse_nodes(text: str) -> int | str:
    if text in scenario.NODE_FILES:
        return text
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        choices = ", ".join(scenario.NODE_FILES)
        raise argparse.ArgumentTypeError(f"{text!r}: give a node count or one of {choices}")
    return count


def add_common(
    parser: argparse.ArgumentParser, *, rate: float, duration: float, nodes: int
) -> None:
    """The flags of the modes that run the simulated cluster (``demo``, ``latency``,
    ``soak``)."""
    parser.add_argument("--nodes", type=parse_nodes, default=nodes, help=NODES_HELP)
    parser.add_argument(
        "--node-limit",
        type=int,
        default=None,
        help="with a node list: only its first N nodes (file order)",
    )
    parser.add_argument(
        "--rate", type=float, default=rate, help=f"jobs created per second (default {rate:g})"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=duration,
        help=f"seconds of arrivals (default {duration:g})",
    )
    parser.add_argument("--median-run", type=float, default=None, help="median pod run time, s")
    parser.add_argument(
        "--drain", type=float, default=None, help="seconds to wait for the last pods"
    )
    parser.add_argument(
        "--quota-scale",
        type=int,
        default=None,
        help="multiply the example queues' GPU quota (default: fit the fleet)",
    )
    parser.add_argument(
        "--extender-weight",
        type=int,
        default=5,
        help="the extender's weight in kube-scheduler (default 5)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--trace",
        default=None,
        help="openb-<variant> (e.g. openb-default, openb-multigpu20): the Alibaba openb "
        "nodes and GPU pods from --data instead of the synthetic HGX fleet and stream",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("reports"), help="report folder (default reports/)"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep server logs, certificates and inputs here"
    )
    _add_remote(parser)


def _add_remote(parser: argparse.ArgumentParser) -> None:
    """A real deployment's endpoints instead of servers started here."""
    remote = parser.add_argument_group(
        "a real deployment",
        "--webhook-url and --extender-url need --kubeconfig for the cluster the extender "
        "watches and binds through. The tool schedules over its own node list (--nodes; "
        "written to --keep/nodes.json), so that cluster must have Nodes of those names "
        "(a run is refused otherwise). Each pod it schedules is created there, in "
        "--namespace (made and labelled app.kubernetes.io/managed-by=tessera-loadtest "
        "if absent; refused if it exists without that label), with schedulerName "
        "tessera-loadtest (no kube-scheduler serves it) and the pause image, and deleted "
        "when its run time is over, so the extender's watch frees its GPUs; leftover "
        "pods are deleted at start and exit, and the namespace too if the run made it. "
        "On nodes with kubelets the pods really start: use a test cluster.",
    )
    remote.add_argument("--webhook-url", help="e.g. https://tessera-webhook.tessera-system.svc:443")
    remote.add_argument("--extender-url", help="e.g. https://tessera-extender:8888")
    remote.add_argument("--ca", type=Path, help="CA that signed the servers' certificates")
    remote.add_argument(
        "--client-cert", type=Path, help="client certificate for the extender's mutual TLS"
    )
    remote.add_argument("--client-key", type=Path)
    remote.add_argument(
        "--kubeconfig", type=Path, help="the deployment's cluster (required with the URLs)"
    )
    remote.add_argument(
        "--namespace",
        default="tessera-loadtest",
        help="where the run's pods go (default tessera-loadtest)",
    )


def _remote(args: argparse.Namespace) -> scenario.Remote | None:
    if args.webhook_url or args.extender_url:
        if not (args.webhook_url and args.extender_url):
            raise SystemExit("python -m loadtest: --webhook-url and --extender-url go together")
        if args.kubeconfig is None:
            raise SystemExit(
                "python -m loadtest: a remote run needs --kubeconfig (the cluster the "
                "extender watches): without it the pods it binds do not exist there and "
                "the GPUs of pods that end are never freed"
            )
        return scenario.Remote(
            args.webhook_url,
            args.extender_url,
            args.ca,
            args.client_cert,
            args.client_key,
            args.kubeconfig,
            args.namespace,
        )
    if args.kubeconfig is not None:
        raise SystemExit("python -m loadtest: --kubeconfig goes with --webhook-url/--extender-url")
    return None


def run_spec(args: argparse.Namespace, base: scenario.RunSpec) -> scenario.RunSpec:
    """The simulated run that ``args`` describe, on ``base``'s defaults."""
    stream = StreamSpec(
        rate=args.rate,
        duration_s=args.duration,
        median_run_s=args.median_run or base.stream.median_run_s,
        max_run_s=base.stream.max_run_s,
    )
    remote = _remote(args)
    node_file = args.nodes if isinstance(args.nodes, str) else None
    if node_file is not None and args.trace is not None:
        raise SystemExit("python -m loadtest: --trace brings its own nodes; drop --nodes")
    if args.node_limit is not None and (node_file is None or args.node_limit < 1):
        raise SystemExit("python -m loadtest: --node-limit N (N >= 1) goes with a node list")
    return scenario.RunSpec(
        fleet=FleetSpec(nodes=args.nodes if node_file is None else base.fleet.nodes),
        node_file=node_file,
        node_limit=args.node_limit,
        stream=stream,
        quota_scale=args.quota_scale,
        drain_s=args.drain if args.drain is not None else base.drain_s,
        extender_weight=args.extender_weight,
        seed=args.seed,
        remote=remote,
        keep_dir=args.keep,
        trace=args.trace,
        data_dir=args.data,
    )


def build_parser(*, data: Path, short: bool) -> argparse.ArgumentParser:
    """Every mode's parser. ``data`` and ``short`` are the defaults ``__main__`` took from
    the environment (``TESSERA_DATA``, ``TESSERA_DEMO_SHORT``)."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description=(
            "Play kube-apiserver, Kueue and kube-scheduler around Tessera's two servers "
            "and measure them."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=data,
        help="folder with the shared traces (default: $TESSERA_DATA or ../shared/data)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_demo(commands, short=short)
    _add_latency(commands)
    _add_soak(commands)
    _add_passthrough(commands)
    p = commands.add_parser("selfcheck", help="the cluster-model self-check, no servers")
    p.add_argument("--max-pods", type=int, default=None)
    return parser


def _add_demo(commands: Commands, *, short: bool) -> None:
    p = commands.add_parser(
        "demo",
        help="both servers, a sample cluster, a short mixed workload",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    base = demo.demo_spec()
    add_common(p, rate=base.stream.rate, duration=base.stream.duration_s, nodes=base.fleet.nodes)
    p.add_argument(
        "--short",
        action="store_true",
        default=short,
        help="a ~15 s run on 16 nodes (CI; also TESSERA_DEMO_SHORT=1, e.g. for make demo)",
    )
    p.add_argument(
        "--real",
        action="store_true",
        help="on the real stack instead (etcd, kube-apiserver, kube-scheduler, "
        "kube-controller-manager, Kueue v0.17.0, both servers as processes, fake GPU nodes; "
        "binaries from make e2e-assets): 16 nodes, ~100 jobs over 45 s, 3 to 4 min with "
        "the stack's start; with --short 8 nodes and a handful of jobs. Of the other "
        "options only --short, --seed, --out and --keep apply",
    )
    p.add_argument(
        "--topology",
        choices=(*real_demo.TOPOLOGIES, "both"),
        default="tessera",
        help="with --real: who keeps gangs in a rack. tessera (default): mode A, the "
        "flavors name their Topology in tessera.dev/topology-name and Tessera's webhook "
        "and extender decide; kueue: mode B, the gang queues' H100 flavors set "
        "spec.topologyName and Kueue's topology-aware scheduling assigns the hosts; both: "
        "the same stream in each mode, on a fresh stack each, figures side by side",
    )


def _add_latency(commands: Commands) -> None:
    p = commands.add_parser(
        "latency",
        help="open-loop latency per verb and end to end",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p, rate=100.0, duration=30.0, nodes=256)
    p.add_argument(
        "--verb-rate",
        type=float,
        default=200.0,
        help="then /mutate, /filter, /prioritize alone at this rate each (0: skip; default 200)",
    )
    p.add_argument(
        "--verb-duration", type=float, default=10.0, help="seconds per verb (default 10)"
    )


def _add_soak(commands: Commands) -> None:
    p = commands.add_parser(
        "soak",
        help="a long steady run: memory growth and errors",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p, rate=30.0, duration=300.0, nodes=64)
    p.add_argument(
        "--max-rss-growth-mib",
        type=float,
        default=50.0,
        help="fail above this growth in the second half (default 50)",
    )


def _add_passthrough(commands: Commands) -> None:
    """The modes that keep their own flags: listed here, parsed by their own ``main``."""
    commands.add_parser(
        "placement",
        help="FGD-style placement quality (python -m loadtest placement --help)",
        add_help=False,
    )
    commands.add_parser(
        "reservations",
        help="gang waits and GPU allocation with no reservations, Tessera's and EASY "
        "backfilling, on an openb trace (python -m loadtest reservations --help)",
        add_help=False,
    )
    for name, what in (("bench-webhook", "webhook"), ("bench-extender", "extender")):
        commands.add_parser(
            name,
            help=f"the {what} benchmark (python -m loadtest {name} --help)",
            add_help=False,
        )
    commands.add_parser(
        "overload",
        help="a server at 1x, 2x, 3x the rate it sustains: in time, failed fast, late, "
        "memory (python -m loadtest overload --help)",
        add_help=False,
    )
