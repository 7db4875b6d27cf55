"""``manifests/monitoring/``: the Grafana dashboard reads only metrics that exist, in
PromQL that Prometheus parses, and each server is scraped through a ServiceMonitor whose
Service reaches that server's metrics port.

A panel over a metric nobody exports stays empty, silently, like a rule over one: every
name in every expression must be one the servers export (read off their registries, as
``test_monitoring_rules.exported`` scrapes them), a rule of ``prometheus-rule.yaml``, one
of DCGM exporter's (``DCGM_FI_*``) or a Kueue metric of the allow-list there. Prometheus
parses each expression when ``promtool`` is there: ``promtool check rules`` on a rules
file that records each one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.unit.test_monitoring_rules import (
    KUEUE_METRICS,
    MONITORING,
    ROOT,
    exported,
    names_in,
    promtool,
    rules,
)

DASHBOARD = MONITORING / "grafana-dashboard.json"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(DASHBOARD.read_bytes())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> dict[str, str]:
    """``panel title / refId`` → expression."""
    return {f"{p['title']} / {t['refId']}": t["expr"] for p in panels() for t in p["targets"]}


def test_every_panel_reads_metrics_that_exist(tmp_path: Path) -> None:
    known = exported(tmp_path) | {r["record"] for r in rules() if "record" in r}
    unknown = {
        where: sorted(missing)
        for where, expr in expressions().items()
        if (
            missing := {
                n
                for n in names_in(expr)
                if n not in known and n not in KUEUE_METRICS and not n.startswith("DCGM_FI_")
            }
        )
    }
    assert unknown == {}
    # what the issue asks the dashboard to show is there
    shown = {n for expr in expressions().values() for n in names_in(expr)}
    assert {
        "tessera:capacity_gpus:max",
        "tessera:gpus_fragmented:ratio",
        "tessera:gpu_allocation_utilisation:ratio",
        "kueue_admission_wait_time_seconds_bucket",
        "kueue_cluster_queue_resource_usage",
        "tessera_webhook_review_seconds_bucket",
        "tessera_extender_request_seconds_bucket",
        "tessera_extender_reservations",
        "tessera_extender_cache_age_seconds",
    } <= shown


def test_promtool_parses_every_panel_expression(tmp_path: Path) -> None:
    tool = promtool()
    group = {
        "name": "dashboard",
        "rules": [
            {"record": f"dashboard:panel_{i}:expr", "expr": expr}
            for i, expr in enumerate(expressions().values())
        ],
    }
    rules_file = tmp_path / "dashboard-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": [group]}), encoding="utf-8")
    done = subprocess.run(
        [tool, "check", "rules", str(rules_file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_panels_use_the_chosen_datasource_and_do_not_overlap() -> None:
    board = dashboard()
    (variable,) = board["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        cells = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        assert not cells & taken, panel["title"]
        taken |= cells
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        assert [t["refId"] for t in panel["targets"]] == [
            chr(65 + i) for i in range(len(panel["targets"]))
        ]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _pod_template(deployment_file: str) -> dict[str, Any]:
    (deployment,) = [
        d for d in _docs(ROOT / "manifests" / deployment_file) if d["kind"] == "Deployment"
    ]
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def _metrics_port(template: dict[str, Any]) -> int:
    spec = template["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    (port,) = [
        p["containerPort"] for c in containers for p in c.get("ports", []) if p["name"] == "metrics"
    ]
    return int(port)


@pytest.mark.parametrize(
    ("monitor", "deployment_file"),
    [("tessera-webhook", "webhook-deployment.yaml"),
     ("tessera-scheduler", "scheduler-deployment.yaml")],
)  # fmt: skip
def test_each_servers_service_monitor_reaches_its_metrics_port(
    monitor: str, deployment_file: str
) -> None:
    docs = _docs(MONITORING / "service-monitors.yaml")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == monitor]
    wanted = sm["spec"]["selector"]["matchLabels"]
    services = [
        d for d in docs
        if d["kind"] == "Service" and wanted.items() <= d["metadata"]["labels"].items()
    ]  # fmt: skip
    (service,) = services
    assert service["spec"]["clusterIP"] == "None"  # its endpoints are the pods: each scraped
    template = _pod_template(deployment_file)
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] == _metrics_port(template)
    assert endpoint["path"] == "/metrics"
