"""What one review costs the webhook's pure path in this process: ``review()`` as the
server calls it (no HTTP, no TLS), its stages, the policy build, and a review right after
a Kueue object changed.

Layer: ROOT (times calls with the injected ``Clock``; may profile). Part of
``bench-webhook``; must not be imported by the servers, and must not change the policy
or the reviews it times.
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.clock import Clock
from cluster.files import load_objects
from loadtest.bench.review_steps import ReviewTemplate, uid_prefix
from loadtest.bench.webhook_policy import CAPTURED_NAMESPACE, CAPTURED_QUEUE
from loadtest.measure.pinned import BenchError
from webhook.admit import admit
from webhook.patch import diff
from webhook.queues import Policy
from webhook.review import decode_review, encode_response
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig, Allowed
from webhook.source import PolicyStore


@dataclass(frozen=True, slots=True)
class InProcess:
    """Seconds per call, measured in this process on the captured review."""

    reviews: int
    review_s: float
    """With the answers the policy keeps: the captured Job again and again, renamed."""
    first_s: float
    """With no answer kept: every review runs the rules, as the first of a template does."""
    stages: tuple[tuple[str, float], ...]
    """``review()``'s parts: decode, decide, diff, encode."""
    policy_build_s: float
    after_change_s: float
    """A review right after a LocalQueue status update (the store rebuilds the policy)."""
    profile: str = ""


def _per_call(
    clock: Clock, call: Callable[[Any], object], items: Sequence[Any], repeat: int = 5
) -> float:
    """Seconds per call, the best of ``repeat`` passes (as ``timeit`` does): on a shared
    machine the slower passes measure the neighbours."""
    best = math.inf
    for _ in range(repeat):
        start = clock.monotonic()
        for item in items:
            call(item)
        best = min(best, (clock.monotonic() - start) / max(1, len(items)))
    return best


def measure_in_process(
    policy_path: Path, template: ReviewTemplate, reviews: int, profile_top: int, clock: Clock
) -> InProcess:
    """``review()`` alone (no HTTP, no TLS) as the server calls it, its stages, the policy
    build, and a review that follows a change to any Kueue object."""
    store = PolicyStore(clock)
    store.load_file(str(policy_path))
    start = clock.monotonic()
    policy = store.current()
    build = clock.monotonic() - start
    assert policy is not None
    config = AdmitConfig()
    prefix = uid_prefix()
    bodies = [template.body(f"{prefix}{i:012x}") for i in range(reviews)]
    review(bodies[0], policy, config)
    per_review = _per_call(clock, lambda body: review(body, policy, config), bodies)

    def first_time(body: bytes) -> object:
        policy.answers.clear()
        return review(body, policy, config)

    per_first = _per_call(clock, first_time, bodies)
    stages = _stages(clock, bodies, policy, config)
    after = _after_change(clock, store, policy_path, bodies, config)
    text = _profile(bodies, policy, config, profile_top) if profile_top else ""
    return InProcess(reviews, per_review, per_first, stages, build, after, text)


def _stages(
    clock: Clock, bodies: Sequence[bytes], policy: Policy, config: AdmitConfig
) -> tuple[tuple[str, float], ...]:
    """``review()``'s parts one by one: decode, admit, diff, encode."""
    requests = [decode_review(body) for body in bodies]
    decisions = [admit(request, policy, config) for request in requests]
    allowed = [d for d in decisions if isinstance(d, Allowed)]
    if len(allowed) != len(decisions):
        raise BenchError("the policy does not admit the captured Job")
    patches = [diff(r.object, d.object) for r, d in zip(requests, allowed, strict=True)]
    return (
        ("decode (orjson + pydantic)", _per_call(clock, decode_review, bodies)),
        ("admit (the nine rules)", _per_call(clock, lambda r: admit(r, policy, config), requests)),
        (
            "diff (JSON Patch)",
            _per_call(
                clock,
                lambda rd: diff(rd[0].object, rd[1].object),
                list(zip(requests, allowed, strict=True)),
            ),
        ),
        (
            "encode the answer",
            _per_call(
                clock,
                lambda rp: encode_response(rp[0].uid, allowed=True, patch=rp[1]),
                list(zip(requests, patches, strict=True)),
            ),
        ),
    )


def _after_change(
    clock: Clock,
    store: PolicyStore,
    policy_path: Path,
    bodies: Sequence[bytes],
    config: AdmitConfig,
) -> float:
    """The median of five reviews, each right after a LocalQueue status update."""
    # Kueue writes LocalQueue status (pending and admitted counts) as workloads move; the
    # webhook's watch hands every such update to the store.
    queue = next(
        o
        for o in load_objects(policy_path)
        if o.get("kind") == "LocalQueue"
        and o["metadata"].get("namespace") == CAPTURED_NAMESPACE
        and o["metadata"]["name"] == CAPTURED_QUEUE
    )
    after: list[float] = []
    for n in range(5):
        store.event("localqueues", "MODIFIED", {**queue, "status": {"pendingWorkloads": n}})
        start = clock.monotonic()
        review(bodies[n], store.current(), config)
        after.append(clock.monotonic() - start)
    return sorted(after)[len(after) // 2]


def _profile(bodies: Sequence[bytes], policy: Policy, config: AdmitConfig, top: int) -> str:
    """cProfile's ``top`` functions by own time over one pass of ``review()``."""
    profiler = cProfile.Profile()
    profiler.enable()
    for body in bodies:
        review(body, policy, config)
    profiler.disable()
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime").print_stats(top)
    return buffer.getvalue()
