"""The Triton kernels checked against attention/reference.py (and transformers' elementwise code) on
a CUDA GPU, then timed beside the torch backend; the result is data (``KernelCheck``), which the GPU
suite's kernels step reads from ``--json``, and the lines a person reads.

The GPU half of the CPU tests: Triton's interpreter cannot see bf16 tl.dot, tf32 or real tiling."""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import sys
from pathlib import Path

import torch
from sarathi_kernels import pointwise
from sarathi_kernels.attention_plan import plan_batch
from sarathi_kernels.bench import do_bench
from sarathi_kernels.gemm import GemmConfig, gemm
from sarathi_kernels.kv_cache import write_kv_cache
from sarathi_kernels.occupancy import device_limits
from sarathi_kernels.paged_attention import paged_attention
from sarathi_kernels.rope_kv import rope_write_kv
from sarathi_kernels.tolerances import COMPILED_TOLERANCE as TOLERANCE
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from sarathi_lab.attention import reference
from sarathi_lab.attention.torch_backend import TorchAttention
from sarathi_lab.config import DTYPES, EngineConfig
from sarathi_lab.measure.profiling import attention as paged
from sarathi_lab.measure.profiling.attention_peers import rel_diff
from sarathi_lab.measure.profiling.ceilings import copy_bandwidth_gbps
from sarathi_lab.measure.profiling.kernel_record import AttentionCase, KernelCheck, Timing, Verdict

DEV = torch.device("cuda")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_inputs(prefills, decodes, heads, kv_heads, head_dim, block_size, dtype):
    query_lens, seq_lens = (list(x) for x in zip(*prefills, *decodes))
    meta, num_blocks = paged.paged_batch(query_lens, seq_lens, num_prefills=len(prefills),
                                         block_size=block_size, device=DEV)
    slots = paged.context_slot_mapping(meta, block_size)
    k_cache, v_cache = (paged.paged_cache(torch.randn(len(slots), kv_heads, head_dim,
                                                      device=DEV).to(dtype),
                                          slots, num_blocks, block_size) for _ in range(2))
    query = torch.randn(sum(query_lens), heads, head_dim, device=DEV).to(dtype)
    return query, k_cache, v_cache, meta


def check_attention(record: KernelCheck, dtype, head_dim, heads, kv_heads, block_size, name="",
                    prefills=None, decodes=None, **launch) -> None:
    """Max |err| / max |ref|; ``planned=True``: the engine's plan of the batch for this GPU."""
    if prefills is None:
        prefills = [(512, 512), (256, 1280), (37, 37), (5, 999)]
        decodes = [(1, random.randint(1, 2048)) for _ in range(32)]
    query, k_cache, v_cache, meta = make_inputs(prefills, decodes or [], heads, kv_heads, head_dim,
                                                block_size, dtype)
    scale = head_dim ** -0.5
    if launch.pop("planned", False):
        launch["plan"] = plan_batch(meta.query_lens_host, meta.seq_lens_host, heads, kv_heads,
                                    element_size=query.element_size(),
                                    limits=device_limits(query.device))
    out = torch.full_like(query, float("nan"))
    paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                    scale, max_query_len=meta.max_query_len, out=out, **launch)
    ref = reference.attention(query.float(), k_cache.float(), v_cache.float(), meta, scale)
    err = float("nan") if out.isnan().any() else rel_diff(out, ref)
    passed = err < TOLERANCE[dtype]
    record.attention.append(AttentionCase(dtype_name(dtype), head_dim, heads, kv_heads, block_size,
                                          err, passed, name))
    print(f"  {dtype!s:15} d={head_dim:3} heads={heads}/{kv_heads:<2} block={block_size}: "
          f"{err:.2e} {'ok' if passed else 'FAIL'}" + (f"  ({name})" if name else ""))


def check_write(dtype, block_size) -> bool:
    _, k_cache, v_cache, meta = make_inputs([(300, 700)], [(1, 90)] * 8, 8, 8, 128, block_size,
                                            dtype)
    key = torch.randn(len(meta.slot_mapping), 8, 128, device=DEV).to(dtype)
    value = torch.randn_like(key)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, k_ref, v_ref, meta.slot_mapping)
    write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    return all(torch.equal(a.nan_to_num(), b.nan_to_num())
               for a, b in ((k_cache, k_ref), (v_cache, v_ref)))


def _close(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b)
    except AssertionError:
        return False
    return True


def check_pointwise(dtype) -> dict[str, bool]:
    """Against transformers' own code at torch's tolerance, at LLaMA-13B's widths."""
    x, res = (torch.randn(37, 5120, device=DEV).to(dtype) for _ in range(2))
    norm = LlamaRMSNorm(5120, 1e-5).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.normal_()
        kept = res.clone()
        out = pointwise.add_rms_norm(x, kept, norm.weight, 1e-5)
        ok = {"add_rms_norm": _close(out, norm(x + res)) and _close(kept, x + res)}
    qk = torch.randn(37, 80, 128, device=DEV).to(dtype)
    positions = torch.randint(0, 4096, (37,), device=DEV)
    inv = 10000 ** (torch.arange(0, 128, 2, device=DEV) / 128)
    freqs = torch.arange(4096, device=DEV).float()[:, None] / inv
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    q, k = apply_rotary_pos_emb(qk[:, :40], qk[:, 40:], cos[positions].to(dtype),
                                sin[positions].to(dtype), 1)
    unrotated = qk.clone()
    pointwise.rope_(qk, positions, cos, sin)
    ok["rope"] = _close(qk[:, :40], q) and _close(qk[:, 40:], k)
    gate_up = torch.randn(37, 2 * 13824, device=DEV).to(dtype)
    ok["silu_mul"] = _close(pointwise.silu_mul(gate_up),
                            ACT2FN["silu"](gate_up[:, :13824]) * gate_up[:, 13824:])
    return ok | check_fused(dtype, unrotated, positions, cos, sin, q, k)


def check_fused(dtype, qk, positions, cos, sin, q, k) -> dict[str, bool]:
    """RoPE + KV write exact to their references; split-K GEMM within attention's tolerance."""
    tokens = qk.shape[0]
    qkv = torch.cat([qk.flatten(1), torch.randn(tokens, 40 * 128, device=DEV).to(dtype)], 1)
    slots = torch.randperm(64 * 16, device=DEV)[:tokens]
    k_cache, v_cache = (torch.zeros(64, 16, 40, 128, device=DEV, dtype=dtype) for _ in range(2))
    out_q = rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, 40, 40)
    ok = {"rope_write_kv": _close(out_q, q) and _close(k_cache.view(-1, 40, 128)[slots], k)
          and torch.equal(v_cache.view(-1, 40, 128)[slots],
                          qkv[:, 80 * 128:].view(tokens, 40, 128))}

    x = (torch.randn(300, 1024, device=DEV) / 1024**0.5).to(dtype)
    w = torch.randn(1024, 1024, device=DEV).to(dtype)
    ok["gemm"] = rel_diff(gemm(x, w), x @ w.T) < TOLERANCE[dtype]
    ok["gemm_split_k"] = rel_diff(gemm(x, w, GemmConfig(split_k=4)), x @ w.T) < TOLERANCE[dtype]
    w_gate_up = torch.randn(2 * 512, 1024, device=DEV).to(dtype)
    product = x @ w_gate_up.T
    want = ACT2FN["silu"](product[:, :512]) * product[:, 512:]
    ok["gemm_silu_mul"] = all(rel_diff(gemm(x, w_gate_up, GemmConfig(split_k=s), gated=True), want)
                              < TOLERANCE[dtype] for s in (1, 3))
    return ok


def run_checks(record: KernelCheck, quick: bool) -> None:
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    shapes = ((32, 32), (32, 8), (32, 4))
    grid = itertools.product(dtypes, (64, 128), shapes, (16, 32))
    if quick:
        grid = [(d, 128, (32, 8), 16) for d in dtypes]
    print("attention vs attention/reference.py (max |err| / max |ref|)")
    for dtype, head_dim, (heads, kv_heads), block_size in grid:
        check_attention(record, dtype, head_dim, heads, kv_heads, block_size)
    # Batches too small to fill the GPU split their KV walk (as planned for this GPU, and forced).
    split_cases = (("chunk 64 over 3072", [(64, 3136)], [], {}),
                   ("decode 1 x 4096", [], [(1, 4096)], {}),
                   ("chunk 256 over 1024 + 17 decodes, 5 splits", [(256, 1280)],
                    [(1, random.randint(1, 2048)) for _ in range(17)], {"num_splits": 5}),
                   ("chunk 256 over 1024 + 17 decodes, planned per work kind", [(256, 1280)],
                    [(1, random.randint(1, 2048)) for _ in range(17)], {"planned": True}),
                   ("chunks 130 over 2048 and 40 over 0 + 2 decodes, planned (tall tiles, split)",
                    [(130, 2178), (40, 40)], [(1, 3000), (1, 17)], {"planned": True}))
    for dtype, (heads, kv_heads), (name, prefills, decodes, launch) in itertools.product(
            dtypes, ((40, 40), (32, 8)), split_cases if not quick else split_cases[:1]):
        check_attention(record, dtype, 128, heads, kv_heads, 16, name, prefills, decodes, **launch)
    for dtype, block_size in itertools.product(dtypes, (16, 32)):
        passed = check_write(dtype, block_size)
        record.kv_writes.append(Verdict(dtype_name(dtype), f"block={block_size}", passed))
        print(f"  kv write {dtype!s:15} block={block_size}: {'ok' if passed else 'FAIL'}")
    for dtype in dtypes:
        for op, passed in check_pointwise(dtype).items():
            record.pointwise.append(Verdict(dtype_name(dtype), op, passed))
            print(f"  pointwise {dtype!s:15} {op}: {'ok' if passed else 'FAIL'}")


# Llama-3-8B's heads in the engine's blocks; the GPU suite reads the case to label its figure.
TIMED_HEADS, TIMED_HEAD_DIM = (paged.LLAMA_HEADS, paged.LLAMA_KV_HEADS), paged.LLAMA_HEAD_DIM
TIMED_BLOCK = EngineConfig.block_size
TIMED_CASE = (f"Llama-3-8B attention ({TIMED_HEADS[0]}/{TIMED_HEADS[1]} heads, "
              f"d={TIMED_HEAD_DIM}), block {TIMED_BLOCK}")
# (name, prefills, decodes): (query, context) per request.
TIMED_BATCHES = (("64 decodes x 2048 ctx", [], [(1, 2048)] * 64),
                 ("256 decodes x 512 ctx", [], [(1, 512)] * 256),
                 ("prefill 2048 whole", [(2048, 2048)], []),
                 ("chunk 512 after 1536", [(512, 2048)], []),
                 ("chunk 512 after 1536 + 32 decodes", [(512, 2048)], [(1, 2048)] * 32))


def time_case(record: KernelCheck, name, prefills, decodes, dtype, copy_gbps):
    (heads, kv_heads), head_dim, block_size = TIMED_HEADS, TIMED_HEAD_DIM, TIMED_BLOCK
    query, k_cache, v_cache, meta = make_inputs(prefills, decodes, heads, kv_heads, head_dim,
                                                block_size, dtype)
    k_cache.nan_to_num_()
    v_cache.nan_to_num_()
    scale = head_dim ** -0.5
    triton_ms = do_bench(lambda: paged_attention(query, k_cache, v_cache, meta.query_start_loc,
                                                 meta.seq_lens, meta.block_tables, scale,
                                                 max_query_len=meta.max_query_len),
                         return_mode="median")
    torch_ms = do_bench(lambda: TorchAttention().attend(query, k_cache, v_cache, meta, scale),
                        return_mode="median")
    kv_bytes = meta.kv_tokens_read * 2 * kv_heads * head_dim * k_cache.element_size()
    gbps = kv_bytes / triton_ms / 1e6
    record.timings.append(Timing(name, triton_ms, torch_ms, gbps))
    print(f"  {name:34} triton {triton_ms:8.3f} ms  torch {torch_ms:8.3f} ms  "
          f"x{torch_ms / triton_ms:5.2f}  KV {gbps:7.0f} GB/s = {gbps / copy_gbps:4.0%} of copy")


def run_timings(record: KernelCheck, dtype) -> None:
    copy_gbps = copy_bandwidth_gbps(DEV)
    record.timed_case, record.timed_dtype = TIMED_CASE, dtype_name(dtype)
    record.copy_gbps = copy_gbps
    print(f"timings, {dtype}, {record.timed_case}; copy bandwidth {copy_gbps:.0f} GB/s")
    for name, prefills, decodes in TIMED_BATCHES:
        time_case(record, name, prefills, decodes, dtype, copy_gbps)
    kv_heads, head_dim, block = TIMED_HEADS[1], TIMED_HEAD_DIM, TIMED_BLOCK
    key = torch.randn(4096, kv_heads, head_dim, device=DEV, dtype=dtype)
    meta, num_blocks = paged.paged_batch([4096], [4096], num_prefills=1, block_size=block,
                                         device=DEV)
    k_cache = torch.empty(num_blocks, block, kv_heads, head_dim, device=DEV, dtype=dtype)
    v_cache = torch.empty_like(k_cache)
    ms = do_bench(lambda: write_kv_cache(key, key, k_cache, v_cache, meta.slot_mapping),
                  return_mode="median")
    gbps = 4 * key.numel() * key.element_size() / ms / 1e6
    record.timings.append(Timing("kv write 4096 tokens", ms, None, gbps))
    print(f"  {'kv write 4096 tokens':34} triton {ms:8.3f} ms  {gbps:.0f} GB/s = "
          f"{gbps / copy_gbps:4.0%} of copy")


def _save(record: KernelCheck, path: Path | None) -> None:
    """Written after each part, so that a crash in the timings leaves the checks to the suite."""
    if path is not None:
        path.write_text(json.dumps(dataclasses.asdict(record), indent=1))


def main(argv: list[str] | None = None) -> int:
    # Compiled kernels are checked here; with this set, Triton chose its interpreter at import.
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("TRITON_INTERPRET=1 is set: unset it, this check runs the compiled kernels")
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.measure kernel_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one correctness case per dtype")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="dtype of the timings")
    parser.add_argument("--json", type=Path,
                        help="also write the result there (KernelCheck as JSON)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs compiled kernels; on CPU run pytest "
              "tests/test_kernels.py")
        return 2
    torch.manual_seed(0)
    random.seed(0)
    record = KernelCheck(device=torch.cuda.get_device_name())
    print(f"device: {record.device}")
    run_checks(record, args.quick)
    _save(record, args.json)
    run_timings(record, getattr(torch, args.dtype))
    _save(record, args.json)
    print("all checks passed" if record.ok else "SOME CHECKS FAILED")
    return 0 if record.ok else 1
