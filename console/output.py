"""What every console command shares: its error, its output, the JSON and YAML it prints.

Layer: PURE (no I/O: it only formats). The commands' ``ConsoleError`` and ``Output``, the
JSON and YAML codecs they print with, and the object-name check made before a name is sent to
the API. Must not read a ``Source``, the environment or the clock, and must not know any
command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from cluster import jsonio

NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ConsoleError(Exception):
    """What the user must fix, in one line."""


@dataclass(frozen=True, slots=True)
class Output:
    """What a command prints: ``text`` on stdout, ``notes`` on stderr."""

    text: str
    notes: tuple[str, ...] = ()


def json_text(value: Any) -> str:
    return jsonio.dumps_pretty(value).decode()


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a Job's script) as YAML literal blocks, readable as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def yaml_text(value: Any) -> str:
    return yaml.dump(value, Dumper=_BlockDumper, sort_keys=False)
