"""What the servers' ``__main__`` modules share: environment-backed flags and one-line
settings errors.

Layer: EDGE (helpers for the command line). Reads no environment itself: callers pass
the mapping that ``__main__`` took from the process. Must not build apps or serve.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from pydantic import ValidationError

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


def env_name(prefix: str, flag: str) -> str:
    """``TESSERA_WEBHOOK_`` + ``tls-cert`` → ``TESSERA_WEBHOOK_TLS_CERT``."""
    return prefix + flag.upper().replace("-", "_")


def env_value(environ: Mapping[str, str], prefix: str, flag: str) -> str | None:
    return environ.get(env_name(prefix, flag))


def env_bool(
    environ: Mapping[str, str], prefix: str, flag: str, parser: argparse.ArgumentParser
) -> bool | None:
    """A switch from the environment; a word that is neither true nor false exits 2."""
    value = env_value(environ, prefix, flag)
    if value is None:
        return None
    word = value.strip().lower()
    if word not in TRUE | FALSE:
        parser.exit(
            2, f"{parser.prog}: error: {env_name(prefix, flag)}={value!r} is not true or false\n"
        )
    return word in TRUE


def one_line(exc: ValidationError) -> str:
    """Every settings error on one line, each with the setting it is about."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}".replace("Value error, ", "")
        for e in exc.errors()
    )
