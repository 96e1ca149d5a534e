"""The public API on a CPU-only machine, started the way users start it: a fresh interpreter, with
nothing set in its environment, whatever was imported first. The CPU path never imports Triton;
``attention="triton"`` runs the kernels in Triton's interpreter even when Triton was imported (by
torch or transformers) before anyone asked for it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="about machines without CUDA")

ROOT = Path(__file__).resolve().parents[1]

# What a notebook that makes and saves a model does first: transformers builds it (and imports Triton).
TRANSFORMERS_FIRST = """
import sys
from tests.hf_models import hf_greedy, save_random_model
hf = save_random_model("llama", sys.argv[1])
assert "triton.language" in sys.modules
"""
RUN = """
import sys
from sarathi_lab import LLM
tokens = {}
for attention in ("torch", "triton"):
    llm = LLM(model=sys.argv[1], attention=attention, device="cpu", dtype="float32", chunk_size=8, warmup_iters=0)
    tokens[attention] = llm.generate([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7]], max_new_tokens=3)
    if attention == "torch":
        # The CPU path did not touch the Triton kernels.
        cpu = {"sarathi_kernels.cpu_build", "sarathi_kernels.cpu_attention", "sarathi_kernels.cpu_ops"}
        assert not any(m.startswith("sarathi_kernels.") and m not in cpu for m in sys.modules)
assert tokens["triton"] == tokens["torch"], tokens
"""
CHECK_HF = """
assert tokens["torch"] == [hf_greedy(hf, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], 3), hf_greedy(hf, [2, 7], 3)], tokens
"""


def _fresh(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.e2e
@pytest.mark.parametrize("first", ["transformers", "sarathi_lab", "torch"])
def test_any_import_order_runs_both_attention_backends(first, tmp_path):
    model = tmp_path / "model"
    if first == "transformers":
        code = TRANSFORMERS_FIRST + RUN + CHECK_HF
    else:
        # The model is made in another process, so this one imports only what ``first`` says first.
        made = _fresh("import sys; from tests.hf_models import save_random_model; "
                      "save_random_model('llama', sys.argv[1])", str(model))
        assert made.returncode == 0, made.stderr[-3000:]
        code = f"import {first}\n" + RUN
    done = _fresh(code, str(model))
    assert done.returncode == 0, done.stderr[-3000:]


_LIBRARY_HELPERS = """
import torch
import triton.language as tl  # Triton first, decorating its helpers for the compiler

from sarathi_kernels.triton_jit import INTERPRETED, jit

@jit
def rows(x_ptr, out_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :])
    # Library helpers called as functions and as tensor methods.
    tl.store(out_ptr + tl.arange(0, N), tl.sum(x, 1) + x.max(1) + tl.zeros([N], tl.float32))

x = torch.arange(16.0).view(4, 4)
out = torch.empty(4)
rows[(1,)](x, out, N=4)
assert INTERPRETED and torch.equal(out, x.sum(1) + x.amax(1)), out
"""


def test_interpreter_runs_library_helpers_after_triton_was_imported():
    done = _fresh(_LIBRARY_HELPERS)
    assert done.returncode == 0, done.stderr[-3000:]
