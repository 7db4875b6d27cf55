"""Where the shared folder beside the checkout is: the recorded captures and the traces.

Layer: test support. Tests that read it skip with a clear message when it is absent; they
never copy it into the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

SHARED: Final = Path(__file__).resolve().parents[2] / "shared"
CAPTURES: Final = SHARED / "captures"
"""Traffic recorded from a real kube-apiserver and kube-scheduler: the wire shapes' truth."""
