"""How messages quote what a user wrote: at most ``ECHO_LIMIT`` characters of it.

Layer: PURE. One function, no I/O. Every message that repeats a value taken from a
request (a queue name, a label or annotation value, a quantity, an object's name) goes
through ``echo``: kube-apiserver hands a mutating webhook the object before it validates
it, so such a value can be as long as the body (megabytes), and a message that repeated
it whole would be that long too, in the answer, in kubectl's output and in events.
"""

from __future__ import annotations

from typing import Final

ECHO_LIMIT: Final = 100
"""Characters of a value a message repeats: a label value (63), a queue or object name
as people write them, and some room; longer ones are cut, with their length given."""


def echo(value: object, *, quote: bool = True, limit: int = ECHO_LIMIT) -> str:
    """``value`` as a message repeats it: ``repr`` (or the text itself, ``quote=False``)
    of at most ``limit`` characters; a longer one is cut and says how long it was:
    ``'aaaa…' (60000 characters)``."""
    text = value if isinstance(value, str) else _repr(value)
    if len(text) <= limit:
        return repr(text) if quote and isinstance(value, str) else text
    head = text[:limit]
    if quote and isinstance(value, str):
        quoted = repr(head)
        return f"{quoted[:-1]}…{quoted[-1]} ({len(text)} characters)"
    return f"{head}… ({len(text)} characters)"


def _repr(value: object) -> str:
    try:
        return repr(value)
    except RecursionError:
        # JSON is read up to 1024 levels deep; repr gives up near Python's recursion limit
        return f"a {type(value).__name__} nested too deeply to show"
