"""Structured logging: one line per event, as ``key=value`` text or as JSON.

Layer: I/O (writes to a stream). Call ``configure`` once from a ``__main__``; modules log
with ``logging.getLogger(__name__).info("event", extra=fields(k=v))``. Must never be
handed secrets: tokens, keys and certificates are logged by file path only.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from cluster import jsonio

_FIELDS = "tessera_fields"
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


def fields(**values: Any) -> dict[str, Any]:
    """The ``extra=`` mapping for a structured log line."""
    return {_FIELDS: values}


def _event_fields(record: logging.LogRecord) -> dict[str, Any]:
    values: dict[str, Any] = dict(getattr(record, _FIELDS, {}) or {})
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key != _FIELDS:
            values[key] = value
    return values


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_event_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return jsonio.dumps(line).decode()


def _text_value(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return jsonio.dumps(text).decode()
    return text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname.lower(), record.name, record.getMessage()]
        parts += [f"{k}={_text_value(v)}" for k, v in _event_fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(*, json: bool = False, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Route every logger to one handler on ``stream`` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every request at INFO; our handlers count requests in metrics instead.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
