"""A batch's shape never makes the CUDA kernels compile again mid-run. Triton keys each compiled
version of a kernel by its arguments' classes (an integer 1, a multiple of 16 or another; a pointer
16-byte aligned or not), so every argument that moves with the batch must stay out of that key: the
integers by ``do_not_specialize``, the runner's packed inputs by their alignment. Checked with
Triton's own binder for an sm90 target on batches the runner packs, on the CPU (no GPU launches)."""
from __future__ import annotations

import json

import pytest

from tests.triton_compile import compile_for_gpu

_SCRIPT = '''
import json, sys
import numpy as np, torch
try:
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
except ImportError:
    print(json.dumps("no binder")); sys.exit()
from sarathi_kernels import kv_cache, paged_attention as pa, split_merge
from sarathi_lab.model.runner import packed, unpacked

backend = make_backend(GPUTarget("cuda", 90, 32))

def keys_of(kernels, call):
    """The specialisation key and grid of each launch ``call()`` makes of each of ``kernels``
    ((module, name) pairs), by name; the launches are captured, not run."""
    found = {name: [] for _, name in kernels}

    class Capture:
        def __init__(self, name, kernel):
            self.name = name
            self.bind = create_function_from_signature(kernel.signature, kernel.params, backend)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: found[self.name].append((str(self.bind(*args, **kwargs)[1]), grid))

    saved = [(module, name, getattr(module, name)) for module, name in kernels]
    for module, name, kernel in saved:
        setattr(module, name, Capture(name, kernel))
    try:
        call()
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)
    return found

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 2, 64, 16
cache = torch.zeros(64, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
attention, merges, writes, splits = set(), set(), set(), set()
# On a GPU of 132 SMs the smaller of these batches split their KV walk (a table 1 block wide cannot).
for requests in (1, 2, 15, 16, 17, 32, 160):
    for width in (1, 2, 16, 17, 64, 65, 257):
        # One decode per request, as batch_tensors packs them: ids, positions, slots, logits rows
        # (int64), then query_start_loc, seq_lens, block tables (int32).
        longs = [np.zeros(requests, np.int64)] * 4
        ints = [np.arange(requests + 1), np.full(requests, BLOCK * width), np.zeros(requests * width)]
        host, spans = packed(longs, ints, lambda n: torch.empty(n, dtype=torch.uint8))
        _, _, slots, _, starts, lens, tables = unpacked(host, spans)
        qkv = torch.zeros(requests, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=torch.bfloat16)
        q = qkv[:, : HEADS * HEAD_DIM].view(requests, HEADS, HEAD_DIM)
        k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(requests, KV_HEADS, HEAD_DIM)
        found = keys_of([(pa, "_paged_attention_kernel"), (split_merge, "_merge_splits_kernel")],
                        lambda: pa.paged_attention(q, cache, cache, starts, lens, tables.view(requests, width),
                                                   max_query_len=1, num_sms=132))
        attention.update(key for key, _ in found["_paged_attention_kernel"])
        merges.update(key for key, _ in found["_merge_splits_kernel"])
        # A decode launch's flat grid is requests x KV heads x splits.
        splits.update(grid[0] // (requests * KV_HEADS) for _, grid in found["_paged_attention_kernel"])
        writes.update(key for key, _ in keys_of([(kv_cache, "_write_kv_kernel")], lambda: kv_cache.write_kv_cache(
            k, k, cache, cache, slots))["_write_kv_kernel"])
print(json.dumps({"attention": len(attention), "merge": len(merges), "write_kv": len(writes),
                  "split_counts": len(splits)}))
'''


def test_decode_batches_of_every_shape_share_one_compiled_kernel():
    done = compile_for_gpu(_SCRIPT)  # its helper imported GPUTarget
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found == "no binder":
        pytest.skip("this Triton has no create_function_from_signature to ask for a launch's key")
    # 49 batch shapes (requests 1 to 160, tables 1 to 257 blocks wide, their parts at moving offsets),
    # split into several counts of programs or not at all.
    assert found.pop("split_counts") > 2, "too few of the batches split their walk to test the split's key"
    assert found == {"attention": 1, "merge": 1, "write_kv": 1}


_HYBRID = _SCRIPT[: _SCRIPT.index("HEADS, KV_HEADS")] + '''
from sarathi_kernels.attention_plan import plan_batch
from sarathi_kernels.occupancy import H100

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 2, 64, 16
cache = torch.zeros(64, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
from sarathi_kernels import chunk_attention as ca
attention, chunks, merges, kinds = set(), set(), set(), set()
# Hybrid batches as the engine plans them for an H100: a chunk of 5 to 300 tokens (64- and 128-row
# tiles, split or not) beside 0 to 17 decodes, tables 2 to 65 blocks wide.
for chunk in (5, 64, 100, 130, 300):
    for decodes in (0, 1, 17):
        for width in (2, 17, 65):
            query_lens, requests = [chunk] + [1] * decodes, 1 + decodes
            tokens = sum(query_lens)
            longs = [np.zeros(tokens, np.int64)] * 3 + [np.zeros(requests, np.int64)]
            ints = [np.concatenate([[0], np.cumsum(query_lens)]), np.full(requests, BLOCK * width),
                    np.zeros(requests * width)]
            host, spans = packed(longs, ints, lambda n: torch.empty(n, dtype=torch.uint8))
            _, _, _, _, starts, lens, tables = unpacked(host, spans)
            qkv = torch.zeros(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=torch.bfloat16)
            q = qkv[:, : HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
            plan = plan_batch(query_lens, [BLOCK * width] * requests, HEADS, KV_HEADS, limits=H100)
            kinds.update((launch.kind, launch.tiles) for launch in plan.launches())
            found = keys_of([(pa, "_paged_attention_kernel"), (split_merge, "_merge_splits_kernel"),
                             (ca, "_chunk_attention_kernel")],
                            lambda: pa.paged_attention(q, cache, cache, starts, lens, tables.view(requests, width),
                                                       plan=plan))
            attention.update(key for key, _ in found["_paged_attention_kernel"])
            chunks.update(key for key, _ in found["_chunk_attention_kernel"])
            merges.update(key for key, _ in found["_merge_splits_kernel"])
print(json.dumps({"attention": len(attention), "chunk": len(chunks), "kinds": len(kinds), "merge": len(merges)}))
'''


def test_hybrid_batches_compile_one_kernel_a_work_kind_and_tile():
    # The balanced kernel on decode tiles and on 64-row and 128-row prefill tiles: one compiled kernel
    # each whatever the batch, the flat one never on a GPU; one merge (tokens with their own split
    # counts, decodes' included).
    done = compile_for_gpu(_HYBRID)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found == "no binder":
        pytest.skip("this Triton has no create_function_from_signature to ask for a launch's key")
    assert found == {"attention": 0, "chunk": 3, "kinds": 3, "merge": 1}, found
