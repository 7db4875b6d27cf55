"""``tessera why`` for pods no node can hold: how many more nodes, of which product, in
which domain ("needs 2 more nodes of NVIDIA-H100-80GB-HBM3 in one rack").

Layer: PURE. From the report ``console.why`` made and the pods' shortfall
(``console.shortfall``) to the report with it: no I/O, no clock. Must not add nodes to a
verdict that is not about pods the scheduler did not place, nor count nodes any other way
than ``console.shortfall`` does.

This matters beside Cluster Autoscaler: it simulates kube-scheduler without the
extender, so a gang that the extender's topology or island rules refuse while the
in-tree filters accept a node never triggers a scale-up; the sentence says what the
autoscaler would not.
"""

from __future__ import annotations

from dataclasses import replace

from console.shortfall import Missing
from console.why import WhyReport

NOT_SCHEDULED = "pod(s) not scheduled"


def with_shortfall(report: WhyReport, missing: Missing | None) -> WhyReport:
    """The verdict with what the unplaced pods lack in nodes, when that is what holds
    them (their verdict is the scheduler's) and nodes are what they lack."""
    if missing is None or NOT_SCHEDULED not in report.verdict:
        return report
    return replace(report, verdict=f"{report.verdict}; {missing.text()}")
