import os

import torch

# Triton decides interpreter vs compiler when a kernel is defined, so this must run before any test
# module imports a kernel; without CUDA the interpreter is the only way to run one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
