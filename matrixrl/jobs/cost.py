"""What a job cost: its wall time, device, peak memory and tokens generated (a result's ``cost``)."""

from __future__ import annotations

import resource
import sys
import time

from matrixrl.results import Cost


class Meter:
    """Started when a job of ``scale`` begins; :meth:`cost` says what it cost so far."""

    def __init__(self, scale: str) -> None:
        self.scale = scale
        self.began = time.perf_counter()

    def cost(self, tokens: int = 0, steps: int | None = None) -> Cost:
        device, peak_gpu = "cpu", None
        torch = sys.modules.get("torch")  # never imported just to ask
        if torch is not None and torch.cuda.is_initialized():
            device, peak_gpu = torch.cuda.get_device_name(), int(torch.cuda.max_memory_allocated())
        kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
        return Cost(
            seconds=time.perf_counter() - self.began, scale=self.scale, device=device, peak_rss_bytes=kilobytes * 1024,
            peak_gpu_bytes=peak_gpu, tokens=tokens, steps=steps,
        )
