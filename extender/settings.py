"""The extender's settings, validated once.

Layer: EDGE. A frozen pydantic model that ``__main__`` fills from flags and environment
variables; ``create_app`` takes it as a value and turns the decision-related part into an
``ExtenderConfig`` (``to_config``). Must not read the environment or any file itself.

``/bind`` writes to the cluster, so only kube-scheduler may call it: plain HTTP is only
served on a loopback address (a kube-scheduler sidecar) unless ``insecure_bind_any`` says
otherwise; anywhere else needs TLS, and ``client_ca`` makes it mutual TLS. (The metrics
listener of ``ServingSettings`` serves ``/metrics`` alone, so it may listen anywhere.)

``max_cache_age_s`` bounds how long ago kube-apiserver may last have been heard on the
node and pod watches before the cache counts as stale (not ready, no filter, no bind).
A healthy watch with nothing to report must still be heard within it, so the watches'
``timeoutSeconds`` follow from it (``watch_timeout_s``).
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from cluster import labels
from cluster.convert.grammar import parse_topology_levels
from extender.config import ExtenderConfig, ScoringWeights, TopologyLevel
from extender.holds import HoldRules
from extender.reservations import ReservationRules
from server.serving_settings import MIB, ServingSettings

_WEIGHTS = ScoringWeights()
_CONFIG = ExtenderConfig()
DEFAULT_LEVELS = f"hostname={labels.HOSTNAME}"
MIN_CACHE_AGE_S = 6.0
"""The shortest staleness limit: its watches last 2 to 4 s (``watch_timeout_s``)."""
UNBOUNDED_WATCH_S = 300
"""``timeoutSeconds`` of the watches when staleness is not checked."""


def parse_levels(text: str) -> tuple[tuple[str, str], ...]:
    """``block=example.com/block,rack=example.com/rack`` → ((name, node label), ...),
    widest level first; ``ValueError`` naming the bad item, or when there is none."""
    levels = parse_topology_levels(text)
    if not levels:
        raise ValueError("at least one topology level is needed (e.g. hostname=...)")
    return levels


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (no name resolution: a name other
    than ``localhost`` may resolve anywhere, so it does not count)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ExtenderSettings(ServingSettings):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None = None
    """Address to listen on; default 0.0.0.0 with TLS, 127.0.0.1 without."""
    port: int = Field(8888, ge=0, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    """Mutual TLS: only clients with a certificate signed by this CA (kube-scheduler's)."""
    insecure_bind_any: bool = False
    """Serve plain HTTP on a non-loopback address anyway (anyone who reaches it can bind)."""
    cert_reload_interval_s: float = Field(10.0, gt=0)

    cluster_file: Path | None = None
    """Standalone mode: nodes and pods from this file; bind records in memory."""
    kubeconfig: Path | None = None
    """Watch nodes and pods and bind through this kubeconfig; neither: in-cluster."""

    topology_levels: tuple[tuple[str, str], ...] = parse_levels(DEFAULT_LEVELS)
    """(name, node label) from the widest level to the narrowest."""
    weight_packing: float = Field(_WEIGHTS.packing, ge=0)
    weight_island_fit: float = Field(_WEIGHTS.island_fit, ge=0)
    weight_gang_locality: float = Field(_WEIGHTS.gang_locality, ge=0)
    strict_islands: bool = True
    """A whole-GPU pod that fits in one NVLink island must get one (else: a preference)."""
    cpu_stranding: float = Field(_CONFIG.cpu_stranding, ge=0, le=1)
    """How much of a free GPU that the node's CPU can no longer serve counts as lost."""
    pod_mix: Literal["learned", "default"] = "learned"
    """The pod sizes packing keeps GPUs usable for: learned from the pods in the cache
    (their GPUs, CPU and products), or the built-in mix (``DEFAULT_POD_MIX``)."""
    pod_mix_interval_s: float = Field(60.0, gt=0)
    """How often the learned pod mix is counted again."""
    choose_in_filter: bool = False
    """``/filter`` names only the node the pod should go to, for pods that state no
    preference of kube-scheduler's own (``ExtenderConfig.choose_in_filter``): it then
    neither scores nor calls ``/prioritize`` for them."""

    max_reservations: int = Field(4, ge=0)
    """Waiting gangs that hold a reservation at once (``extender.holds``), the higher
    priority first, then the oldest; 0: no reservations (nothing is planned)."""
    reservation_interval_s: float = Field(10.0, gt=0)
    """Reservations are planned again when a gang member cannot place, and while any is
    held, at most once per this many seconds."""
    requeue_grace_s: float = Field(180.0, ge=0)
    """How long a gang whose pods are gone (Kueue's waitForPodsReady requeued it, or it
    was deleted) keeps its reservation and its place in the order."""
    reservation_namespace: str = Field("tessera-system", min_length=1, max_length=63)
    """Where each reservation is recorded as a Lease (the extender's own namespace)."""

    assume_ttl_s: float = Field(30.0, gt=0)
    """How long a bind's GPUs stay counted without the watch showing the pod bound."""
    expire_interval_s: float = Field(1.0, gt=0)
    bind_timeout_s: float = Field(4.0, gt=0)
    """Budget of the API calls of one bind; below kube-scheduler's 5 s httpTimeout."""
    max_cache_age_s: float = Field(30.0, ge=0)
    """Seconds since kube-apiserver was last heard on a watch before the cache is stale:
    /readyz says 503 and /filter, /prioritize, /bind and /preempt refuse. 0: never."""
    reasons_kept: int = Field(2048, ge=0)
    """Pods whose last /filter reasons are kept for ``GET /debug/reasons`` on the metrics
    listener (``extender.reasons``); 0: none, and the page answers 404."""
    recent_pods: int = Field(10_000, ge=0)
    """Pods kept from the last requests (``wire.RecentPods``): /prioritize reads the pod
    /filter decoded, and a /bind that comes before the watch shows its pod finds it."""

    max_body_bytes: int = Field(64 * MIB, ge=64 * 1024)
    """5,000 full Node objects (``nodeCacheCapable: false``) are ~25 MB."""
    max_buffered_body_bytes: int = Field(128 * MIB, ge=64 * 1024)
    """Two bodies of the largest size at once (with ``nodeCacheCapable: true`` a body
    names the nodes: a few hundred kilobytes)."""
    request_timeout_s: float = Field(5.0, gt=0)
    """How long kube-scheduler waits for an answer: the extender's ``httpTimeout`` in
    its KubeSchedulerConfiguration (5 s in manifests/scheduler-config.yaml)."""
    log_json: bool = False
    log_level: str = "INFO"

    @field_validator("topology_levels", mode="before")
    @classmethod
    def _levels_text(cls, value: Any) -> Any:
        return parse_levels(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> ExtenderSettings:
        if self.cluster_file is not None and self.kubeconfig is not None:
            raise ValueError("give --cluster-file or --kubeconfig, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("--client-ca needs --tls-cert and --tls-key (mutual TLS)")
        exposed = not is_loopback(self.listen_host)
        if self.tls_cert is None and exposed and not self.insecure_bind_any:
            raise ValueError(
                f"refusing plain HTTP on {self.listen_host!r}: anyone who reaches it could "
                "bind pods. Give --tls-cert/--tls-key (and --client-ca), listen on a "
                "loopback address, or pass --insecure-bind-any"
            )
        if 0 < self.max_cache_age_s < MIN_CACHE_AGE_S:
            raise ValueError(
                f"--max-cache-age must be 0 (off) or at least {MIN_CACHE_AGE_S:g} seconds, "
                f"got {self.max_cache_age_s:g}: the watches must be heard from within it"
            )
        self.to_config()  # a bad level or weight is a settings error, not a crash later
        return self

    @property
    def watch_timeout_s(self) -> int:
        """The watches' ``timeoutSeconds`` ``t``: the informer asks for [t, 2t), and
        kube-apiserver sends a bookmark 2 s before the end, so even a watch with nothing
        to report is heard within 2t, at most two thirds of ``max_cache_age_s``."""
        if not self.max_cache_age_s:
            return UNBOUNDED_WATCH_S
        return int(self.max_cache_age_s // 3)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def listen_host(self) -> str:
        if self.host is not None:
            return self.host
        return "0.0.0.0" if self.tls else "127.0.0.1"  # noqa: S104 - a pod serves on all

    def hold_rules(self) -> HoldRules:
        """The reservations' bound and grace (``extender.holds``)."""
        return HoldRules(
            ReservationRules(max_reservations=self.max_reservations),
            timedelta(seconds=self.requeue_grace_s),
        )

    def to_config(self) -> ExtenderConfig:
        """What the decisions read; ``ValueError`` for levels or weights they refuse."""
        return ExtenderConfig(
            levels=tuple(TopologyLevel(name, label) for name, label in self.topology_levels),
            weights=ScoringWeights(
                packing=self.weight_packing,
                island_fit=self.weight_island_fit,
                gang_locality=self.weight_gang_locality,
            ),
            islands_required=self.strict_islands,
            cpu_stranding=self.cpu_stranding,
            choose_in_filter=self.choose_in_filter,
        )
