"""vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide once it has bound its threads.

It runs in our process (no worker process on the CPU), so without this every later caller in the
same process (the next sweep job, a benchmark's ``--threads``) would get a logged warning in place
of the thread count it asked for. The engine is built inside :func:`torch_threads_kept`, which puts
torch's own function back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    own = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = own
