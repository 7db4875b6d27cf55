"""``tessera``: the platform team's console (``python -m console``).

Layer: ROOT. The only module of the console that reads the environment: every flag has a
``TESSERA_CONSOLE_<FLAG>`` variable, and ``KUBECONFIG`` is honoured as kubectl honours
it. Must not decide anything: it parses, opens the cluster (a file, a kubeconfig, or the
pod's service account), runs one command and prints. Exits 0 on success, 1 with one line
on stderr when the command cannot do what was asked, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

from cluster.clock import Clock, SystemClock
from cluster.files import ObjectFileError
from cluster.kube import KubeClient, KubeConfig, KubeError
from console import (
    annotate,
    capacity_cmd,
    capacity_range_cmd,
    node_write_cmd,
    nodes_cmd,
    queues_cmd,
    sbatch_cmd,
    upgrade_cmd,
    why_cmd,
)
from console.output import ConsoleError, Output
from console.reasons import DEFAULT_EXTENDER
from console.source import ApiSource, FileSource, ReadOnlyError, Source
from server.cli import env_bool, env_value

PROG = "tessera"
ENV_PREFIX = "TESSERA_CONSOLE_"
EXAMPLES = """\
examples:
  tessera nodes                                  # GPUs per product, flavor, block, rack
  tessera nodes --by-node --cluster-file cluster.yaml
  tessera nodes --node gpu-a-0 -o json
  tessera queues
  tessera capacity                               # does a team need more quota or more nodes?
  tessera capacity --prometheus http://prometheus:9090 --range 7d   # ... over the last week
  tessera capacity --from-run reports/demo.json --html capacity.html  # ... over a load test
  tessera why job/pretrain -n team-nlp             # webhook, Kueue and extender, stage by stage
  tessera why pretrain-0-x7k2p -n team-nlp --extender http://127.0.0.1:8889
  tessera drain gpu-a-0 --at 2026-12-01T02:00:00Z --reason "driver 570"
  tessera undrain gpu-a-0
  tessera gpu-health gpu-a-0 --unhealthy 3,5 --reason "XID 79"
  tessera upgrade-plan --selector example.com/capacity=reserved --window 2h --keep 80%
  tessera upgrade-plan -l nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 --apply --reason "driver 570"
  tessera sbatch train.sbatch --queue-map gpu=training --image registry/train:1 --dry-run
"""


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tessera's console: GPUs, queues, drains and Slurm scripts.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)

    def flag(target: argparse.ArgumentParser, name: str, *short: str, **kwargs: Any) -> None:
        default = env_value(environ, ENV_PREFIX, name)
        if default is None:
            default = kwargs.pop("default", None)
        else:
            kwargs.pop("default", None)
        target.add_argument(*short, f"--{name}", default=default, **kwargs)

    flag(common, "cluster-file", help="read the cluster from this file (kubectl get -o yaml)")
    flag(
        common,
        "kubeconfig",
        help="talk to the cluster through this kubeconfig (default: $KUBECONFIG, "
        "~/.kube/config, then the pod's service account)",
    )
    flag(common, "context", help="the kubeconfig context to use (default: its current one)")
    flag(
        common,
        "output",
        "-o",
        choices=("table", "json", "yaml"),
        default="table",
        help="table (default), json, or yaml (sbatch only)",
    )
    commands_ = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    nodes = commands_.add_parser(
        "nodes", parents=[common], help="GPUs total/allocated/free/unhealthy, like sinfo"
    )
    flag(nodes, "node", help="one node, GPU by GPU")
    nodes.add_argument(
        "--by-node",
        action=argparse.BooleanOptionalAction,
        default=env_bool(environ, ENV_PREFIX, "by-node", parser) or False,
        help="one row per node instead of per product, flavor and domain",
    )
    flag(
        nodes,
        "topology-levels",
        help="name=node-label pairs, widest first, as the extender's flag (default: the "
        "levels of the Kueue Topology objects)",
    )
    flag(nodes, "gang-gpus", type=int, default=8, help="GPUs of one gang pod (default 8)")
    flag(
        nodes,
        "reservation-namespace",
        default="tessera-system",
        help="namespace of the extender's reservation Leases (default tessera-system)",
    )

    commands_.add_parser(
        "queues", parents=[common], help="workloads, GPUs, quota and waits per queue, like squeue"
    )

    capacity = commands_.add_parser(
        "capacity",
        parents=[common],
        help="per flavor and ClusterQueue: quota against GPUs, and whether the work waiting "
        "needs more quota or more nodes; with --prometheus, over a time range",
    )
    flag(
        capacity,
        "prometheus",
        help="a Prometheus URL: report over --range from Kueue's and Tessera's metrics "
        "instead of the cluster now",
    )
    flag(capacity, "range", default="7d", help="with --prometheus: how far back (default 7d)")
    flag(
        capacity,
        "from-run",
        help="a load-test run's JSON (python -m loadtest demo, latency or soak): the same "
        "report over the run instead of the cluster now",
    )
    flag(
        capacity,
        "html",
        help="with --prometheus or --from-run: also write the report as an HTML page with "
        "plots to this file",
    )

    why = commands_.add_parser(
        "why",
        parents=[common],
        help="why a job, jobset or pod is not running: webhook, Kueue, extender, events",
    )
    why.add_argument(
        "target", metavar="[KIND/]NAME", help="job/NAME, jobset/NAME, pod/NAME or NAME"
    )
    flag(why, "namespace", "-n", default="default", help="its namespace (default: default)")
    flag(
        why,
        "extender",
        default=DEFAULT_EXTENDER,
        help="where the extender's /debug/reasons is: pods:NAMESPACE/SELECTOR, asked through "
        f"kube-apiserver's pod proxy (default {DEFAULT_EXTENDER}), URL[,URL…] "
        "(e.g. a kubectl port-forward to port 8889), or none",
    )

    def writer(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands_.add_parser(name, parents=[common], help=help)
        sub.add_argument("node_name", metavar="NODE")
        flag(sub, "reason", default="", help="why, for the Event on the node")
        sub.add_argument("--dry-run", action="store_true", help="print the change, write nothing")
        return sub

    drain = writer("drain", "set the node's maintenance window (tessera.dev/drain-after)")
    drain.add_argument("--at", required=True, help="RFC 3339 time, now, or +2h")
    writer("undrain", "remove the node's maintenance window")
    health = writer("gpu-health", "mark GPUs unhealthy (tessera.dev/unhealthy-gpus)")
    health.add_argument(
        "--unhealthy", required=True, help="GPU indices (3,5 or 0-3); '' marks all healthy"
    )

    upgrade = commands_.add_parser(
        "upgrade-plan",
        parents=[common],
        help="waves of nodes for a driver upgrade, in the order their jobs end; --apply "
        "sets their drain-after windows",
    )
    flag(
        upgrade,
        "selector",
        "-l",
        required=env_value(environ, ENV_PREFIX, "selector") is None,
        help="the nodes to upgrade, as kubectl -l takes them: key=value,key!=value,key,!key",
    )
    flag(upgrade, "window", default="2h", help="how long one wave is out (default 2h)")
    flag(
        upgrade,
        "keep",
        default="80%",
        help="share of each flavor's (or GPU product's) GPUs every wave keeps schedulable "
        "(default 80%%)",
    )
    flag(upgrade, "not-before", help="no wave starts before this (RFC 3339, now, +2h)")
    flag(upgrade, "reason", default="", help="why, for the Events on the nodes")
    upgrade.add_argument(
        "--apply",
        action="store_true",
        help="set each node's tessera.dev/drain-after to its wave's start (with an Event)",
    )

    sbatch = commands_.add_parser(
        "sbatch", parents=[common], help="a Slurm batch script as an Indexed Job"
    )
    sbatch.add_argument("script", metavar="FILE")
    flag(sbatch, "queue-map", default="", help="partition=queue pairs, comma-separated")
    flag(sbatch, "image", help="container image the script runs in")
    flag(sbatch, "namespace", "-n", default="default", help="namespace of the Job")
    sbatch.add_argument("--dry-run", action="store_true", help="print the Job, create nothing")
    return parser


def kubeconfig_path(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The kubeconfig to use, as kubectl finds one; None: in-cluster."""
    if args.kubeconfig:
        return str(args.kubeconfig)
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    home = environ.get("HOME")
    if home and (Path(home) / ".kube" / "config").is_file():
        return str(Path(home) / ".kube" / "config")
    return None


async def run(args: argparse.Namespace, environ: Mapping[str, str], clock: Clock) -> Output:
    """Open the cluster the flags name and run the command on it."""
    async with AsyncExitStack() as stack:
        source: Source | None = None
        if args.cluster_file:
            source = FileSource(Path(args.cluster_file))
        elif not (args.command == "sbatch" and args.dry_run) and not _over_range(args):
            path = kubeconfig_path(args, environ)
            if path is not None:
                config = await KubeConfig.from_kubeconfig(path, context=args.context)
            else:
                config = KubeConfig.in_cluster(environ)
            client = await stack.enter_async_context(
                KubeClient(config, clock=clock, user_agent="tessera-console")
            )
            source = ApiSource(client)
        return await _command(args, source, clock)
    raise AssertionError("unreachable")  # pragma: no cover - the stack re-raises or returns


def _command(args: argparse.Namespace, source: Source | None, clock: Clock) -> Awaitable[Output]:
    output = args.output
    if output == "yaml" and args.command != "sbatch":
        raise ConsoleError("-o yaml is for sbatch; use -o json")
    if args.command == "sbatch":
        return _sbatch(args, source)
    html = Path(args.html) if args.command == "capacity" and args.html else None
    if args.command == "capacity" and args.from_run:
        if args.prometheus:
            raise ConsoleError("give --prometheus or --from-run, not both")
        return _ready(
            capacity_range_cmd.capacity_from_run(Path(args.from_run), output=output, html=html)
        )
    if _over_range(args):
        return capacity_range_cmd.capacity_over_range(
            args.prometheus, args.range, clock, output=output, html=html
        )
    if html is not None:
        raise ConsoleError("--html is for a report over a range: add --prometheus or --from-run")
    return _on_cluster(args, source, clock, output)


def _on_cluster(
    args: argparse.Namespace, source: Source | None, clock: Clock, output: str
) -> Awaitable[Output]:
    if source is None:  # pragma: no cover - run() opens one for every other command
        raise ConsoleError("no cluster to read")
    if args.command == "nodes":
        return nodes_cmd.nodes(
            source,
            clock,
            output=output,
            levels=args.topology_levels,
            node=args.node,
            gang_gpus=int(args.gang_gpus),
            by_node=args.by_node,
            reservation_namespace=str(args.reservation_namespace),
        )
    if args.command == "queues":
        return queues_cmd.queues(source, clock, output=output)
    if args.command == "capacity":
        return capacity_cmd.capacity(source, clock, output=output)
    if args.command == "why":
        return why_cmd.why(
            source,
            clock,
            args.target,
            namespace=args.namespace,
            extender=args.extender,
            output=output,
        )
    if args.command == "upgrade-plan":
        return upgrade_cmd.upgrade_plan(
            source,
            clock,
            selector=args.selector,
            window=args.window,
            keep=args.keep,
            not_before=args.not_before,
            reason=args.reason,
            apply=args.apply,
            output=output,
        )
    decide: Callable[..., annotate.NodeWrite]
    if args.command == "drain":
        try:
            when = annotate.drain_time(args.at, clock.now())
        except annotate.WriteError as exc:
            raise ConsoleError(str(exc)) from None
        decide = partial(annotate.drain, when=when, reason=args.reason)
    elif args.command == "undrain":
        decide = partial(annotate.undrain, reason=args.reason)
    else:
        decide = partial(annotate.gpu_health, unhealthy=args.unhealthy, reason=args.reason)
    return node_write_cmd.write_node(
        source, clock, args.node_name, decide, output=output, dry_run=args.dry_run
    )


def _over_range(args: argparse.Namespace) -> bool:
    """``tessera capacity --prometheus`` or ``--from-run``: Prometheus or a run's file is
    read, not the cluster."""
    return args.command == "capacity" and bool(args.prometheus or args.from_run)


async def _ready(output: Output) -> Output:
    return output


def _sbatch(args: argparse.Namespace, source: Source | None) -> Awaitable[Output]:
    path = Path(args.script)
    try:
        script = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConsoleError(f"cannot read {path}: {exc}") from None
    return sbatch_cmd.sbatch(
        source,
        script,
        path.name,
        namespace=args.namespace,
        image=args.image,
        queue_map=args.queue_map,
        output=args.output,
        dry_run=args.dry_run,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> int:
    env = dict(os.environ) if environ is None else environ
    parser = build_parser(env)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "nodes":
        try:
            args.gang_gpus = int(args.gang_gpus)
        except ValueError:
            parser.exit(2, f"{PROG}: error: --gang-gpus {args.gang_gpus!r} is not a number\n")
        if args.gang_gpus < 1:
            parser.exit(2, f"{PROG}: error: --gang-gpus must be at least 1\n")
    try:
        result = asyncio.run(run(args, env, clock or SystemClock()))
    except (ConsoleError, ObjectFileError, KubeError, ReadOnlyError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(note, file=sys.stderr)
    sys.stdout.write(result.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
