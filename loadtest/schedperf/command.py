"""``python -m loadtest sched-perf``: flags, the runs in alternating order, the table.

Layer: ROOT of the mode (argv in; prints, writes the JSON; ``loadtest.__main__`` writes
the HTML page next to it). Must not measure or decide anything itself: ``run`` measures,
``results`` computes the figures.

    python -m loadtest sched-perf --nodes 1000 --pods 2000 --rate 0 --repeats 3 \\
        --json reports/sched-perf.json

``--nodes-to-score PCT`` runs the tessera profile with that ``percentageOfNodesToScore``
instead of the shipped one (0: kube-scheduler's adaptive sample), to measure a sample
against the manifest's value before changing it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from cluster.clock import SystemClock
from loadtest.inputs.traces import (
    DEFAULT_DATA_DIR,
    OPENB_POD_VARIANTS,
    TraceMissing,
    read_openb_pods,
)
from loadtest.schedperf import profiles
from loadtest.schedperf.results import COMPONENTS, RunRecord, report, run_figures
from loadtest.schedperf.run import Setup, run_profile
from loadtest.schedperf.workload import hgx_nodes, shapes

DEFAULT_JSON: Final = Path("reports") / "sched-perf.json"
MISSING_BINARIES: Final = (
    "python -m loadtest sched-perf: the control plane's binaries (Kubernetes v1.36.3 and "
    "etcd) are missing and could not be built. Get them with `make e2e-assets` (needs "
    "Go >= 1.26; cached in ~/.cache/tessera), or set KUBEBUILDER_ASSETS to a folder "
    "holding etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest sched-perf",
        description=(
            "The real kube-scheduler v1.36 on a loopback control plane (no kubelets), the "
            "same GPU pods scheduled three ways on fresh identical clusters: in-tree with "
            "MostAllocated on GPUs (in_tree), in-tree default (in_tree_default) and the "
            "shipped tessera-gpu profile with the extender (tessera). Reports creation -> "
            "bound latency, throughput, CPU per pod of each process and placement."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=1000, help="HGX nodes (8 GPUs each)")
    parser.add_argument("--pods", type=int, default=2000, help="pods to create")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="pods created a second (0: all at once)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each profile")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="the results (and the HTML beside)"
    )
    parser.add_argument(
        "--profiles",
        default=",".join(profiles.PROFILES),
        help="which profiles, comma-separated",
    )
    parser.add_argument(
        "--trace", default="default", choices=OPENB_POD_VARIANTS, help="openb pod list"
    )
    parser.add_argument(
        "--gang-share", type=float, default=0.05, help="share of pods in 8-GPU rack gangs"
    )
    parser.add_argument(
        "--nodes-to-score",
        type=_percent,
        default=None,
        metavar="PCT",
        help="percentageOfNodesToScore of the tessera profile (default: the shipped "
        "manifest's; 0: left out, kube-scheduler's adaptive sample)",
    )
    parser.add_argument(
        "--extender-env",
        type=_env_item,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the extender's environment over its shipped Deployment's env, e.g. "
        "TESSERA_EXTENDER_CHOOSE_IN_FILTER=false (repeatable)",
    )
    parser.add_argument(
        "--background",
        type=_count,
        default=0,
        metavar="K",
        help="pods bound before the measured ones, evenly over the nodes, requesting "
        "nothing: the lists, watches and caches of a busy cluster (the extender's "
        "restart rebuilds from all of them)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--idle", type=float, default=30.0, help="end a run after this long with no bind, s"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest run, s")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="the traces")
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: temporary)")
    return parser


def _env_item(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("TESSERA_EXTENDER_"):
        raise argparse.ArgumentTypeError(f"{text!r} is not TESSERA_EXTENDER_<SETTING>=<value>")
    return name, value


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of pods (0 or more)")
    return count


def _percent(text: str) -> int:
    try:
        return profiles.checked_percent(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def _score(percent: Any) -> str:
    return "adaptive (0)" if percent == profiles.ADAPTIVE else f"{percent}"


def table(data: dict[str, Any]) -> list[str]:
    """The summary printed at the end, one row per profile."""
    head = "profile           pods/s   p50 ms   p99 ms   CPU ms/pod " + " / ".join(COMPONENTS)
    lines = [head]
    for profile in profiles.PROFILES:
        figures = data.get(profile)
        if not figures:
            continue
        cpu = " / ".join(_cell(figures["cpu_ms_per_pod"].get(c)) for c in COMPONENTS)
        stranded = figures["placement"].get("stranded_free_gpus")
        unbound = figures["placement"].get("unschedulable_by_size", {})
        lines.append(
            f"{profile:<16} {_cell(figures['pods_per_s']):>7} {_cell(figures['p50_ms']):>8} "
            f"{_cell(figures['p99_ms']):>8}   {cpu}   unbound {unbound or 0} (gang members "
            f"{_cell(figures.get('gang_members_unbound'))}, their p99 "
            f"{_cell(figures.get('gang_p99_ms'))} ms) "
            f"stranded GPUs {_cell(stranded)}"
        )
    settings = data.get("settings", {})
    if "nodes_to_score" in settings:
        lines.append(
            f"tessera percentageOfNodesToScore {_score(settings['nodes_to_score'])} (shipped "
            f"{_score(settings.get('nodes_to_score_shipped'))}); in-tree: adaptive"
        )
    ratio = data["ratio"]
    lines.append(
        f"tessera/in_tree: throughput {_cell(ratio['throughput'])}, p99 {_cell(ratio['p99'])}"
        f" (median of {len(ratio['per_repeat'])} repeat(s)); extender CPU / scheduler CPU "
        f"{_cell(data['extender_cpu_over_scheduler'])}"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chosen = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = set(chosen) - set(profiles.PROFILES)
    if unknown or not chosen:
        print(f"--profiles: one or more of {', '.join(profiles.PROFILES)}", file=sys.stderr)
        return 2
    from loadtest.stack import install  # noqa: PLC0415 - heavy, only for this mode
    from loadtest.stack.controlplane import (  # noqa: PLC0415
        BinariesUnavailableError,
        find_binaries,
    )

    try:
        trace = read_openb_pods(args.data, args.trace)
    except TraceMissing as exc:
        print(f"python -m loadtest sched-perf: {exc}", file=sys.stderr)
        return 2
    try:
        binaries = find_binaries(progress=sys.stderr)
    except (BinariesUnavailableError, RuntimeError) as exc:
        print(f"{MISSING_BINARIES}\n{exc}", file=sys.stderr)
        return 2
    installed = install.load_install(binaries / "kubectl")
    shipped = installed.scheduler_configuration
    extender_env = {**installed.extender_env, **dict(args.extender_env)}
    shipped_score = profiles.nodes_to_score(shipped)
    nodes_to_score = shipped_score if args.nodes_to_score is None else args.nodes_to_score
    clock = SystemClock()
    pods = shapes(trace, args.pods, gang_share=args.gang_share, seed=args.seed)
    nodes = hgx_nodes(args.nodes)
    settings = {
        "rate": args.rate,
        "repeats": args.repeats,
        "trace": args.trace,
        "gang_share": args.gang_share,
        "seed": args.seed,
        "idle_s": args.idle,
        "gpus_asked": round(sum(s.gpu_demand for s in pods), 1),
        "gpus": sum(n.gpus for n in nodes),
        "shipped_scheduler_config": shipped,
        "nodes_to_score": nodes_to_score,
        "nodes_to_score_shipped": shipped_score,
        "extender_env": extender_env,
        "background": args.background,
    }
    runs: list[RunRecord] = []
    with tempfile.TemporaryDirectory(prefix="tessera-sched-perf-") as tmp:
        workdir = args.workdir or Path(tmp)
        setup = Setup(binaries, shipped, nodes, pods, args.rate, args.idle, args.timeout,
                      workdir, clock, nodes_to_score=nodes_to_score,
                      extender_env=extender_env, background=args.background)  # fmt: skip
        for repeat in range(args.repeats):
            for profile in [p for p in profiles.order(repeat) if p in chosen]:
                print(f"repeat {repeat + 1}/{args.repeats}: {profile}", flush=True)
                record = run_profile(profile, repeat, setup)
                runs.append(record)
                f = run_figures(record)
                print(
                    f"  bound {f['bound']}/{len(pods)}, {f['pods_per_s']} pods/s (created "
                    f"{f['created_per_s']}/s), p50 "
                    f"{f['p50_ms']} ms, p99 {f['p99_ms']} ms, CPU ms/pod {f['cpu_ms_per_pod']}",
                    flush=True,
                )
    data = report(runs, nodes=args.nodes, pods=args.pods, settings=settings)
    print("\n".join(table(data)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_bytes(jsonio.dumps(data))
    print(f"results: {args.json}")
    return 0
