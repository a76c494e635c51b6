"""Energy meters: hardware energy counters read before and after each generation.

Only counters are used, never a power model: where no counter can be read, energy is unavailable
(`pick_meter` returns None) and the report says so. Both counters cover a whole device (all GPUs NVML is
asked about, or all CPU packages), so other work on the same device is counted too.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


class Meter(ABC):
    name: str

    @abstractmethod
    def read(self) -> list[float]:
        """The raw counters (one per zone or device); pass two readings to `joules`."""

    @abstractmethod
    def joules(self, before: list[float], after: list[float]) -> float:
        """Energy used between two readings, in joules."""


class RAPLMeter(Meter):
    """CPU package energy from Linux powercap (intel-rapl:N/energy_uj, microjoules). The counter wraps
    at max_energy_range_uj; a reading that went down has wrapped once (readings are seconds apart,
    a wrap takes minutes at full power)."""

    def __init__(self, root: str | Path = POWERCAP):
        root = Path(root)
        # top-level zones only (intel-rapl:0, not intel-rapl:0:0): sub-zones are parts of a package
        self.zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not self.zones:
            raise OSError(f"no RAPL zones under {root}")
        self.ranges = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
        self.read()  # unreadable counters (root-only on recent kernels) raise here
        self.name = f"RAPL CPU package energy ({len(self.zones)} package{'s' * (len(self.zones) > 1)})"

    def read(self) -> list[float]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def joules(self, before, after) -> float:
        total = 0
        for b, a, span in zip(before, after, self.ranges, strict=True):
            total += a - b if a >= b else a + span - b
        return total / 1e6


class NVMLMeter(Meter):
    """GPU energy from NVML's total-energy counter (millijoules since the driver loaded; Volta or newer),
    summed over the GPUs CUDA_VISIBLE_DEVICES names by index, else every GPU."""

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible and all(v.strip().isdigit() for v in visible.split(",")):
            indices = [int(v) for v in visible.split(",")]
        else:
            indices = range(pynvml.nvmlDeviceGetCount())
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        if not self.handles:
            raise OSError("NVML sees no GPU")
        self.read()
        self.name = f"NVML GPU energy counter ({len(self.handles)} GPU{'s' * (len(self.handles) > 1)})"

    def read(self) -> list[float]:
        return [float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]

    def joules(self, before, after) -> float:
        return sum(a - b for a, b in zip(after, before, strict=True)) / 1e3


def pick_meter(device: str = "cpu", rapl_root: str | Path = POWERCAP) -> Meter | None:
    """The first readable meter for where the models run (a GPU: NVML, then RAPL; a CPU: RAPL), or None."""
    kinds = (
        [NVMLMeter, lambda: RAPLMeter(rapl_root)] if str(device).startswith("cuda") else [lambda: RAPLMeter(rapl_root)]
    )
    for make in kinds:
        try:
            return make()
        except Exception:  # no driver, no library, no such folder, no permission: this meter is unreadable
            continue
    return None
