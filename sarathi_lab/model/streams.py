"""The two streams nano-batches run on, joined by events as a multi-stream graph capture asks."""
from __future__ import annotations

import contextlib
import functools
from typing import Protocol

import torch


class StreamPair(Protocol):
    def mark(self, stream: str):
        """An event recorded on ``stream`` ("main" or "side") after the work issued to it so far."""

    def wait(self, stream: str, event) -> None:
        """Work issued to ``stream`` from now waits for ``event``."""

    def on_side(self) -> contextlib.AbstractContextManager:
        """Work issued inside runs on the side stream."""

    def hand(self, tensor: torch.Tensor, stream: str) -> None:
        """The allocator must not reuse ``tensor`` before ``stream``'s work on it is done."""


class InOrder:

    def mark(self, stream: str):
        return None

    def wait(self, stream: str, event) -> None:
        pass

    def on_side(self):
        return contextlib.nullcontext()

    def hand(self, tensor: torch.Tensor, stream: str) -> None:
        pass


@functools.cache
def _side_stream(device: torch.device):
    return torch.cuda.Stream(device)


class CudaStreams:

    def __init__(self, device: torch.device):
        self.streams = {"main": torch.cuda.current_stream(device), "side": _side_stream(device)}

    def mark(self, stream: str):
        event = torch.cuda.Event()
        event.record(self.streams[stream])
        return event

    def wait(self, stream: str, event) -> None:
        self.streams[stream].wait_event(event)

    def on_side(self):
        return torch.cuda.stream(self.streams["side"])

    def hand(self, tensor: torch.Tensor, stream: str) -> None:
        tensor.record_stream(self.streams[stream])


def streams_for(device: torch.device) -> StreamPair:
    return CudaStreams(device) if device.type == "cuda" else InOrder()
