"""What one pod of a trace asks for, as the placement and the reservation studies read it.

Layer: PURE. A frozen value and its arithmetic: no I/O, no clock, no cluster objects.
Must not know which study or policy uses it; both key their memos on it, so two pods
that ask for the same are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MILLI: Final = 1000


@dataclass(frozen=True, slots=True)
class PodAsk:
    """``num_gpu`` GPUs of ``gpu_milli`` each (a share is one GPU of less than 1000),
    CPU, memory and the GPU models it accepts (empty: any)."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def gpu_demand(self) -> int:
        """Milli-GPUs the pod takes (the FGD method's arrived and allocated totals)."""
        return self.num_gpu * self.gpu_milli

    @property
    def whole(self) -> bool:
        """Whole GPUs, not a share of one."""
        return self.gpu_milli >= MILLI

    def accepts(self, model: str) -> bool:
        return not self.gpu_spec or model in self.gpu_spec
