"""The webhook's Prometheus metrics, one registry per app (no process-global state).

Layer: I/O (exposition). Counts what ``review_flow`` reports; must not decide anything.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from server.serving import GcPauses
from server.tally import Counts, Timings
from webhook.review_flow import ReviewOutcome

# Admission is on every create's critical path: resolve well below a millisecond.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class WebhookMetrics:
    def __init__(self, policy_age_s: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.gc_pauses = GcPauses(self.registry, "tessera_webhook")
        self.reviews = Counts(
            self.registry,
            "tessera_webhook_reviews",
            "AdmissionReviews answered, by object kind, decision, reason and queue.",
            ("kind", "decision", "reason", "queue"),
        )
        self.latency = Timings(
            self.registry,
            "tessera_webhook_review_seconds",
            "Time from body read to answer, decode and decision included.",
            LATENCY_BUCKETS,
        )
        self.answers = Counts(
            self.registry,
            "tessera_webhook_answers",
            "Allowed CREATEs by where the answer came from: kept (an object like it was "
            "answered before, under the same policy) or computed (the rules ran).",
            ("source",),
        )
        self.policy_age = Gauge(
            "tessera_webhook_policy_age_seconds",
            "Seconds since the queue policy last changed.",
            registry=self.registry,
        )
        self.policy_age.set_function(policy_age_s)

    def observe(self, outcome: ReviewOutcome, seconds: float) -> None:
        self.reviews.inc(outcome.kind, outcome.decision, outcome.reason, outcome.queue)
        self.latency.observe(seconds)
        if outcome.answer:
            self.answers.inc(outcome.answer)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
