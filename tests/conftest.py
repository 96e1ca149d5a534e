import os

import torch

# Triton decides interpreter vs compiler when a kernel is defined, so this must run before any test
# module imports a kernel; without CUDA the interpreter is the only way to run one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Build the CPU decode kernel here, once, before any test: the end-to-end tests start jobs as
# subprocesses (one is SIGKILLed on purpose), and a process killed while building would leave
# torch's build lock behind for every later one.
from sarathi_kernels import cpu_decode  # noqa: E402

cpu_decode.available()
