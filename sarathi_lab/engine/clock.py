"""Timing that means the same on both devices: on CUDA the forward pass is timed with device
events and wall times are taken after a synchronise; on the CPU every op is synchronous."""
from __future__ import annotations

import time

import torch


class DeviceClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_forward(self):
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def stop_forward(self, token) -> float:
        """Seconds since ``start_forward``; on CUDA this waits for the forward pass to finish."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return token.elapsed_time(end) / 1e3
        return time.perf_counter() - token
