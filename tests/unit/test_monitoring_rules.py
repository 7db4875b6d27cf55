"""``manifests/monitoring/``: every rule names only metrics that exist, and Prometheus's own
checker accepts the rules and their tests when it is there.

A rule over a metric nobody exports never fires and records nothing, silently: so every
name in every expression must be one the servers export (read off their registries, the
way Prometheus would scrape them), a rule recorded in the same file, one of DCGM
exporter's (``DCGM_FI_*``) or one of the few Kueue metrics named below.

``promtool`` is looked for on ``PATH`` and in ``~/.cache/tessera/promtool-*/bin`` (where
``tests/e2e/build_binaries.sh promtool`` puts Debian's, or
``go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0`` with
``GOBIN=~/.cache/tessera/promtool-v0.316.0/bin`` puts it); without it those two tests
are skipped, saying so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cluster.clock import ManualClock
from extender.app import create_app
from extender.settings import ExtenderSettings
from server.guard import ConnectionGuard
from server.serving import EXPOSITION
from server.serving_settings import Limits
from tests.builders import node_json
from webhook.metrics import WebhookMetrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RULE_FILE = MONITORING / "prometheus-rule.yaml"
RULE_TESTS = ROOT / "tests" / "monitoring" / "rules-test.yaml"
NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
KUEUE_METRICS = frozenset(
    {
        # Kueue's controller, per ClusterQueue (kueue/pkg/metrics)
        "kueue_admission_wait_time_seconds_bucket",
        "kueue_admission_wait_time_seconds_count",
        "kueue_pending_workloads",
        # with Kueue's --metrics.enableClusterQueueResources, per flavor and resource
        "kueue_cluster_queue_nominal_quota",
        "kueue_cluster_queue_resource_usage",
    }
)
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}
    | {"group_left", "group_right", "inf", "nan"}
)


def rule_spec() -> dict[str, Any]:
    rule = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
    assert rule["kind"] == "PrometheusRule"
    spec: dict[str, Any] = rule["spec"]
    return spec


def rules() -> list[dict[str, Any]]:
    return [r for group in rule_spec()["groups"] for r in group["rules"]]


def names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (no full parser: strings, label
    matchers, grouping clauses and ranges are cut, then bare names are what remain
    before anything but a call's parenthesis)."""
    text = re.sub(r'"[^"]*"', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    found = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        found.add(name)
    return found


def exported(folder: Path) -> set[str]:
    """Every sample name the two servers' registries can show, as scraped."""
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(node_json("gpu-a", rack="r1")), encoding="utf-8")
    settings = ExtenderSettings(cluster_file=cluster, topology_levels=(("rack", "r"),))
    extender = create_app(settings, clock=ManualClock(NOW))[EXPOSITION]()
    webhook = WebhookMetrics(lambda: 0.0)
    ConnectionGuard(
        Limits(),
        ManualClock(NOW),
        lambda method, path, query: None,
        registry=webhook.registry,
        prefix="tessera_webhook",
    )
    names: set[str] = set()
    for page in (extender, webhook.exposition()):
        for family in text_string_to_metric_families(page.decode()):
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_count", "_sum"),
            }.get(family.type, ("",))
            names.update(family.name + suffix for suffix in suffixes)
    return names


def test_every_rule_reads_metrics_that_exist(tmp_path: Path) -> None:
    known = exported(tmp_path)
    recorded = {r["record"] for r in rules() if "record" in r}
    unknown = {}
    for rule in rules():
        missing = {
            name
            for name in names_in(rule["expr"])
            if name not in known
            and name not in recorded
            and name not in KUEUE_METRICS
            and not name.startswith("DCGM_FI_")
        }
        if missing:
            unknown[rule.get("record") or rule.get("alert")] = sorted(missing)
    assert unknown == {}
    # the checker checks itself: the names it found are the ones the rules are about
    assert {"tessera_extender_capacity_gpus", "DCGM_FI_DEV_GPU_UTIL"} <= {
        n for r in rules() for n in names_in(r["expr"])
    }


def test_the_name_reader_sees_past_matchers_clauses_and_ranges() -> None:
    expr = (
        'sum by (verb, le) (rate(a_total{result=~"x|y"}[5m])) / on () '
        'b:c:max{state="free"} > 0 and ignoring (x) d'
    )
    assert names_in(expr) == {"a_total", "b:c:max", "d"}


def test_every_alert_says_how_bad_and_what_happened() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert len(alerts) >= 8
    for alert in alerts:
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, alert["alert"]
        assert alert["annotations"]["summary"], alert["alert"]
    records = [r["record"] for r in rules() if "record" in r]
    # level:metric:operations, as Prometheus's naming practice asks
    assert all(re.fullmatch(r"tessera:[a-z_]+:[a-z_]+", name) for name in records), records


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    built = sorted((Path.home() / ".cache" / "tessera").glob("promtool-*/bin/promtool"))
    if built:
        return str(built[-1])
    pytest.skip(
        "promtool not found on PATH nor in ~/.cache/tessera/promtool-*/bin: "
        "GOBIN=~/.cache/tessera/promtool-v0.316.0/bin go install "
        "github.com/prometheus/prometheus/cmd/promtool@v0.316.0 (or apt-get install "
        "prometheus) to run `promtool check rules` and `promtool test rules`"
    )


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    tool = promtool()
    rules_file = tmp_path / "tessera-rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule_spec()), encoding="utf-8")
    done = subprocess.run(
        [tool, "check", "rules", str(rules_file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_runs_the_rules_unit_tests(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "tessera-rules.yaml").write_text(yaml.safe_dump(rule_spec()), encoding="utf-8")
    shutil.copy(RULE_TESTS, tmp_path / "rules-test.yaml")
    done = subprocess.run(
        [tool, "test", "rules", "rules-test.yaml"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
