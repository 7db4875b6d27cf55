"""The webhook's settings, validated once.

Layer: EDGE. A frozen pydantic model that ``__main__`` fills from flags and environment
variables; ``create_app`` takes it as a value. Must not read the environment itself.
How it serves (read deadlines, bounds, metrics listener, shutdown) is the servers'
shared ``ServingSettings``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field, model_validator

from cluster import labels
from server.serving_settings import MIB, ServingSettings
from webhook.owners import JOB_CONTROLLER_USERNAMES, JOBSET_CONTROLLER_USERNAMES

MAX_TIMEOUT_S = 30.0
"""The longest ``?timeout=`` honoured: a webhook's ``timeoutSeconds`` is at most 30."""


class WebhookSettings(ServingSettings):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "0.0.0.0"  # noqa: S104 - a pod serves on all its interfaces
    port: int = Field(8443, ge=1, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    cert_reload_interval_s: float = Field(10.0, gt=0)

    policy_file: Path | None = None
    """Standalone mode: Kueue objects from this file instead of a watch."""
    kubeconfig: Path | None = None
    """Watch Kueue objects through this kubeconfig; neither this nor a file: in-cluster."""
    kueue_version: str = "v1beta2"

    scheduler_name: str = labels.DEFAULT_SCHEDULER_NAME
    managed_namespaces: frozenset[str] = frozenset()
    """Namespaces where a GPU workload with no queue is denied (``*``: all)."""
    job_controller_usernames: tuple[str, ...] = JOB_CONTROLLER_USERNAMES
    """Who may create the pods a Job owns and have them let through unchanged; empty:
    any sender (the owner must still exist with the uid the pod names)."""
    jobset_controller_usernames: tuple[str, ...] = JOBSET_CONTROLLER_USERNAMES
    """Likewise for the Jobs a JobSet owns."""

    max_body_bytes: int = Field(3 * MIB, ge=64 * 1024)
    """kube-apiserver caps objects at 1.5 MiB; a review carries object and oldObject."""
    max_buffered_body_bytes: int = Field(32 * MIB, ge=64 * 1024)
    """Ten reviews of the largest size at once, thousands of usual ones (~10 KB)."""
    request_timeout_s: float = Field(10.0, gt=0)
    """The deadline of a review that comes without ``?timeout=`` (kube-apiserver always
    sends one; 10 s is a webhook's default ``timeoutSeconds``)."""
    log_json: bool = False
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _one_source(self) -> WebhookSettings:
        if self.policy_file is not None and self.kubeconfig is not None:
            raise ValueError("give --policy-file or --kubeconfig, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self
