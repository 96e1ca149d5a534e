"""The C++ paged-decode kernel against PyTorch's attention over the same context, gathered."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_decode

pytestmark = pytest.mark.skipif(not cpu_decode.available(), reason="the CPU kernel did not build here")


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=6), block_size=st.sampled_from([1, 8, 16, 32]),
       kv_heads=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 3, 4]), head_dim=st.sampled_from([8, 64, 80]),
       seed=st.integers(0, 2**16))
def test_paged_decode_equals_sdpa(lens, block_size, kv_heads, group, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen)  # blocks anywhere, as a served cache holds them
    tables = torch.zeros(len(lens), max(need) + 2, dtype=torch.int32)  # padded, like the engine's
    used = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = order[used : used + nb].int()
        used += nb
    query = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen)
    scale = head_dim**-0.5
    got = cpu_decode.paged_decode(query, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), scale)
    for i, n in enumerate(lens):
        rows = tables[i, : need[i]].long()
        k = k_cache[rows].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1)
        v = v_cache[rows].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1)
        want = F.scaled_dot_product_attention(query[i].unsqueeze(1), k, v, scale=scale, enable_gqa=True).squeeze(1)
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
