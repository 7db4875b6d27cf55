"""The settings both servers share about how they serve: read deadlines, the bounds on
work in flight, the metrics listener and the shutdown grace.

Layer: EDGE. A pydantic base model each server's settings extend (overriding the
defaults that differ), its flags for ``__main__``, and ``limits()``: the frozen
``Limits`` that ``server.guard`` reads. Must not read the environment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_in_flight: int = 64
    max_buffered_body_bytes: int = 32 * MIB
    max_body_bytes: int = 3 * MIB
    """The largest body a handler accepts: what a request with no length reserves, and
    the most a declared length reserves (a larger one is refused without being read)."""
    deadline_margin_s: float = 0.1
    budget_wait_s: float = 0.5
    max_head_bytes: int = 64 * 1024
    skip_body_bytes: int = 64 * 1024
    """A refused request's body up to this size is read and dropped, so that its
    connection stays open for the next; a larger one closes the connection instead."""
    idle_timeout_s: float = 3630.0
    """A keep-alive connection with no request under way is closed after this long:
    aiohttp's own keep-alive timeout, for the requests the guard answers itself."""


class ServingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metrics_host: str = "127.0.0.1"
    """Where the plain-HTTP ``/metrics`` listener listens (its own port, never the
    serving port)."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """0: no metrics listener."""
    header_timeout_s: float = Field(10.0, gt=0)
    """From a request's first byte (a new connection's: the end of its TLS handshake)
    to the end of its head; also bounds the TLS handshake."""
    body_timeout_s: float = Field(10.0, gt=0)
    """From the end of a request's head to the last byte of its body."""
    max_in_flight: int = Field(64, ge=1)
    """Requests handed to the server and not yet answered; one more is answered 429 at once."""
    max_body_bytes: int = Field(3 * MIB, ge=64 * 1024)
    max_buffered_body_bytes: int = Field(32 * MIB, ge=64 * 1024)
    """Declared body bytes of the requests in flight, at most."""
    request_timeout_s: float = Field(10.0, gt=0)
    """How long the server's client waits for an answer (the servers say which)."""
    deadline_margin_s: float = Field(0.1, ge=0)
    """A request with less than this left before its deadline is answered 504 at once."""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """On SIGTERM: how long the requests under way may take to finish."""
    idle_timeout_s: float = Field(3630.0, gt=0)
    """A keep-alive connection with no request under way is closed after this long."""

    @model_validator(mode="after")
    def _coherent_limits(self) -> ServingSettings:
        if self.max_buffered_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"--max-buffered-body-bytes ({self.max_buffered_body_bytes}) must hold at "
                f"least one body of --max-body-bytes ({self.max_body_bytes})"
            )
        if self.deadline_margin_s >= self.request_timeout_s:
            raise ValueError("--deadline-margin must be shorter than --request-timeout")
        return self

    def limits(self) -> Limits:
        return Limits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            max_in_flight=self.max_in_flight,
            max_buffered_body_bytes=self.max_buffered_body_bytes,
            max_body_bytes=self.max_body_bytes,
            deadline_margin_s=self.deadline_margin_s,
            idle_timeout_s=self.idle_timeout_s,
        )


def add_serving_flags(flag: Callable[..., None]) -> None:
    """The flags of ``ServingSettings`` (but ``--request-timeout``, whose meaning each
    server words itself), through the ``__main__``'s own ``flag(name, **kwargs)``."""
    float_s: dict[str, Any] = {"type": float}
    flag("metrics-host", help="address of the plain-HTTP /metrics listener (default 127.0.0.1)")
    flag("metrics-port", type=int, help="port of the /metrics listener (default 0: none)")
    flag(
        "header-timeout",
        dest="header_timeout_s",
        help="seconds to receive a request's head, and a TLS handshake (default 10)",
        **float_s,
    )
    flag(
        "body-timeout",
        dest="body_timeout_s",
        help="seconds to receive a request's body after its head (default 10)",
        **float_s,
    )
    flag(
        "max-in-flight",
        type=int,
        help="requests under way at most; more are answered 429 at once (default 64)",
    )
    flag("max-body-bytes", type=int, help="the largest request body accepted")
    flag(
        "max-buffered-body-bytes",
        type=int,
        help="declared body bytes of the requests under way at most; a request that does "
        "not fit waits 0.5 s, then is answered 429",
    )
    flag(
        "deadline-margin",
        dest="deadline_margin_s",
        help="a request with less than this many seconds left before its deadline is "
        "answered 504 at once (default 0.1)",
        **float_s,
    )
    flag(
        "idle-timeout",
        dest="idle_timeout_s",
        help="seconds a keep-alive connection may wait for its next request (default 3630)",
        **float_s,
    )
    flag(
        "shutdown-grace",
        dest="shutdown_grace_s",
        help="on SIGTERM, seconds the requests under way may take to finish (default 10)",
        **float_s,
    )
