"""The CPU paged-attention kernels (decode and prefill) against attention/reference.py (PyTorch's
scaled_dot_product_attention over the gathered context), and how the CPU kernels are built: once,
content-addressed, atomically, one line."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels import cpu_attention, cpu_build

from sarathi_lab.attention import reference
from sarathi_lab.measure.profiling.attention import paged_batch

needs_kernel = pytest.mark.skipif(not cpu_attention.available(), reason="the CPU kernel did not build here")


def decode_inputs(lens, block_size, kv_heads, group, head_dim, seed):
    """One decode per request, its context already cached in scattered blocks; unused slots hold NaN."""
    torch.manual_seed(seed)
    meta, num_blocks = paged_batch([1] * len(lens), lens, num_prefills=0, block_size=block_size)
    k_cache = torch.full((num_blocks + 2, block_size, kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    for cache in (k_cache, v_cache):
        for i, n in enumerate(lens):
            pos = torch.arange(n)
            blocks = meta.block_tables[i, pos // block_size].long()
            cache[blocks, pos % block_size] = torch.randn(n, kv_heads, head_dim)
    # Strided rows, as q inside the fused qkv output (float32 keeps them; .to(bfloat16) copies).
    query = torch.randn(len(lens), kv_heads * (group + 2), head_dim)[:, : kv_heads * group]
    return query, k_cache, v_cache, meta


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=6), block_size=st.sampled_from([1, 8, 16, 32]),
       kv_heads=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 3, 4]), head_dim=st.sampled_from([8, 64, 80]),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_paged_decode_equals_reference(lens, block_size, kv_heads, group, head_dim, seed, dtype):
    query, k_cache, v_cache, meta = (t.to(dtype) if isinstance(t, torch.Tensor) else t
                                     for t in decode_inputs(lens, block_size, kv_heads, group, head_dim, seed))
    scale = head_dim**-0.5
    # Padded tables, as the engine's: the kernel must stop at each request's length.
    tables = torch.cat([meta.block_tables, torch.zeros(len(lens), 2, dtype=torch.int32)], 1)
    got = cpu_attention.paged_decode(query, k_cache, v_cache, tables, meta.seq_lens, scale)
    assert got.dtype == dtype
    # The reference in float32 over the same (rounded) inputs; bfloat16 output rounds once more.
    want = reference.attention(query.float(), k_cache.float(), v_cache.float(), meta, scale)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@needs_kernel
def test_paged_decode_refuses_what_it_would_misread():
    query, k_cache, v_cache, meta = decode_inputs([5, 9], 4, 2, 2, 8, 0)
    args = (meta.block_tables, meta.seq_lens, 0.3)
    with pytest.raises(ValueError, match="with contiguous caches"):
        cpu_attention.paged_decode(query, k_cache.transpose(0, 1), v_cache, *args)
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors of one dtype"):
        cpu_attention.paged_decode(query.double(), k_cache.double(), v_cache.double(), *args)
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors of one dtype"):
        cpu_attention.paged_decode(query.bfloat16(), k_cache, v_cache, *args)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_attention.paged_decode(query, k_cache, v_cache, meta.block_tables.long(), meta.seq_lens, 0.3)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_attention.paged_decode(query[:, :, :4], k_cache, v_cache, *args)



def prefill_inputs(chunks, block_size, kv_heads, group, head_dim, seed):
    """Prefill chunks (q_len, context before it), every context token already cached in scattered
    blocks (unused slots hold NaN); queries are strided rows, as q inside the fused qkv output."""
    torch.manual_seed(seed)
    q_lens, lens = [q for q, _ in chunks], [q + before for q, before in chunks]
    meta, num_blocks = paged_batch(q_lens, lens, num_prefills=len(chunks), block_size=block_size)
    k_cache = torch.full((num_blocks + 2, block_size, kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    for cache in (k_cache, v_cache):
        for i, n in enumerate(lens):
            pos = torch.arange(n)
            cache[meta.block_tables[i, pos // block_size].long(), pos % block_size] = torch.randn(n, kv_heads, head_dim)
    qkv = torch.randn(sum(q_lens), kv_heads * (group + 2), head_dim)
    return qkv[:, : kv_heads * group], k_cache, v_cache, meta


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(1, 150), st.integers(0, 150)), min_size=1, max_size=4),
       block_size=st.sampled_from([1, 8, 16, 32]), kv_heads=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 3, 4]), head_dim=st.sampled_from([8, 40, 64, 80]), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_paged_prefill_equals_reference(chunks, block_size, kv_heads, group, head_dim, seed, dtype):
    query, k_cache, v_cache, meta = (t.to(dtype) if isinstance(t, torch.Tensor) else t
                                     for t in prefill_inputs(chunks, block_size, kv_heads, group, head_dim, seed))
    scale = head_dim**-0.5
    tables = torch.cat([meta.block_tables, torch.zeros(len(chunks), 2, dtype=torch.int32)], 1)
    got = cpu_attention.paged_prefill(query, k_cache, v_cache, tables, meta.query_start_loc, meta.seq_lens, scale)
    assert got.dtype == dtype and got.is_contiguous()
    want = reference.attention(query.float().contiguous(), k_cache.float(), v_cache.float(), meta, scale)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@needs_kernel
@settings(max_examples=20, deadline=None)
@given(chunk=st.tuples(st.integers(1, 150), st.integers(0, 200)), climb=st.sampled_from([2.0, 12.0, 40.0]),
       head_dim=st.sampled_from([64, 80, 128]), group=st.sampled_from([1, 4]), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_paged_prefill_with_a_growing_max_equals_reference(chunk, climb, head_dim, group, seed, dtype):
    """Scores that climb by ``climb`` along the context, so that every row's max keeps growing: the
    AMX kernel moves a row's max only when a block passes it by 8 ln 2, and then rescales
    accumulators held in tile registers (64-wide heads) or in memory (80, 128; keys read in place from
    the cache where d is a multiple of 32: 64, 128); a slow climb rarely does.
    The climb rides on the last element of every key, times a query element of 1 / scale, so that
    it adds exactly to the random scores without making their float32 rounding larger."""
    query, k_cache, v_cache, meta = prefill_inputs([chunk], 16, 2, group, head_dim, seed)
    scale = head_dim**-0.5
    block_order = torch.empty(len(k_cache))
    block_order[meta.block_tables[0].long()] = torch.arange(meta.block_tables.shape[1], dtype=torch.float)
    position = torch.arange(16.0)[None, :] + 16 * block_order[:, None]
    k_cache[..., -1] = (climb / sum(chunk)) * position[:, :, None]
    query[..., -1] = 1 / scale
    query, k_cache, v_cache = query.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    got = cpu_attention.paged_prefill(query, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                      meta.seq_lens, scale)
    want = reference.attention(query.float().contiguous(), k_cache.float(), v_cache.float(), meta, scale)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_no_requests_is_empty(dtype):
    # Called directly with nothing to do, the kernels return (they once divided by zero / sized
    # buffers by the longest of no contexts).
    k_cache, query = torch.zeros(4, 16, 2, 64, dtype=dtype), torch.zeros(0, 2, 64, dtype=dtype)
    table, none = torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    prefill = cpu_attention.paged_prefill(query, k_cache, k_cache.clone(), table, torch.zeros(1, dtype=torch.int32),
                                          none, 0.1)
    decode = cpu_attention.paged_decode(query, k_cache, k_cache.clone(), table, none, 0.1)
    assert prefill.shape == decode.shape == (0, 2, 64)


@needs_kernel
def test_paged_prefill_refuses_what_it_would_misread():
    query, k_cache, v_cache, meta = prefill_inputs([(5, 3), (4, 0)], 4, 2, 2, 8, 0)
    args = (meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.3)
    with pytest.raises(ValueError, match="contiguous caches and query heads"):
        cpu_attention.paged_prefill(query.transpose(1, 2), k_cache, v_cache, *args)
    with pytest.raises(ValueError, match="query_start_loc"):
        cpu_attention.paged_prefill(query, k_cache, v_cache, meta.block_tables, meta.query_start_loc[1:],
                                    meta.seq_lens, 0.3)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_attention.paged_prefill(query, k_cache, v_cache, meta.block_tables[:1], *args[1:])
    with pytest.raises(ValueError, match="out must be"):
        cpu_attention.paged_prefill(query, k_cache, v_cache, *args, out=torch.empty(9, 4, 8).transpose(0, 1))

def _fresh(code: str, cache: os.PathLike, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose kernel cache is ``cache``."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), **env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


_USE = "from sarathi_kernels import cpu_attention; print(cpu_attention.available())"


@pytest.mark.kernel_build
def test_built_once_with_one_line_then_loaded(tmp_path):
    first = _fresh(_USE, tmp_path)
    assert first.stdout.split() == ["True"], first.stderr
    assert first.stderr.count("\n") == 1 and "building the CPU kernels" in first.stderr
    builds = list((tmp_path / "sarathi_lab" / "kernels").glob("*.so"))
    assert len(builds) == 1 and builds[0].with_name(builds[0].name + ".sha256").is_file()
    # A build killed before its rename leaves only a temporary directory beside the builds.
    (builds[0].parent / ".build-killed").mkdir()
    (builds[0].parent / ".build-killed" / builds[0].name).write_bytes(b"half a library")
    again = _fresh(_USE, tmp_path)
    assert again.stdout.split() == ["True"] and again.stderr == ""


@pytest.mark.kernel_build
def test_loading_the_kernels_keeps_subnormals_for_the_rest_of_the_process(tmp_path):
    # A library linked with -ffast-math turns on flush-to-zero/denormals-are-zero process-wide when
    # it loads; hypothesis then refuses to draw floats in every later test of the session.
    code = _USE + """
import torch
x = torch.tensor([1e-40])
print(5e-324 * 1.0 > 0, 2.2250738585072014e-308 / 4 > 0, bool((x * 1.0 > 0).all()))
"""
    for _ in ("build", "cached load"):
        done = _fresh(code, tmp_path)
        assert done.stdout.split() == ["True", "True", "True", "True"], done.stderr


@pytest.mark.kernel_build
def test_no_compiler_falls_back_in_one_line(tmp_path):
    code = _USE + """
import torch
from sarathi_lab.attention import reference
from sarathi_lab.attention.torch_backend import TorchAttention
from sarathi_lab.measure.profiling.attention import paged_batch
meta, blocks = paged_batch([3, 1], [7, 12], num_prefills=1, block_size=4)
k, v, q = torch.randn(blocks, 4, 2, 8), torch.randn(blocks, 4, 2, 8), torch.randn(4, 4, 8)
got = TorchAttention().attend(q, k, v, meta, 0.3)
torch.testing.assert_close(got, reference.attention(q, k, v, meta, 0.3))
"""
    done = _fresh(code, tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
    assert done.stderr.count("\n") == 1 and "fall back to torch" in done.stderr


def test_build_key_covers_the_cpu_and_the_compiler(monkeypatch):
    key = cpu_build._build_key("c++")
    monkeypatch.setattr(cpu_build, "_cpu_flags", lambda: "fpu sse2 avx2")
    avx2 = cpu_build._build_key("c++")
    assert avx2 != key
    changed = dataclasses.replace(cpu_build.KERNELS, compile=(*cpu_build.KERNELS.compile, "-O2"))
    assert cpu_build._build_key("c++", changed) != avx2


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 70), block_size=st.sampled_from([1, 8, 16]), kv_heads=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([8, 64, 80]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_write_kv_equals_index_copy(tokens, block_size, kv_heads, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    blocks = -(-tokens // block_size) + 3
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=g).to(dtype)
    # Strided rows, as k and v inside the fused qkv output.
    qkv = torch.randn(tokens, 3 * kv_heads, head_dim, generator=g).to(dtype)
    key, value = qkv[:, kv_heads : 2 * kv_heads], qkv[:, 2 * kv_heads :]
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, want_k, want_v, slots)
    cpu_attention.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@needs_kernel
def test_write_kv_refuses_what_it_would_write_out_of_bounds():
    k_cache, v_cache = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    key = value = torch.ones(3, 2, 8)
    with pytest.raises(IndexError, match=r"slot_mapping\[2\] = 8 is outside the cache's 8 slots"):
        cpu_attention.write_kv(key, value, k_cache, v_cache, torch.tensor([0, 1, 8]))
    assert not k_cache.any() and not v_cache.any()  # nothing written
    with pytest.raises(IndexError, match=r"slot_mapping\[0\] = -1"):
        cpu_attention.write_kv(key, value, k_cache, v_cache, torch.tensor([-1, 1, 2]))
    with pytest.raises(ValueError, match="int64 CPU slot_mapping"):
        cpu_attention.write_kv(key, value, k_cache, v_cache, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="of their dtype"):
        cpu_attention.write_kv(key.bfloat16(), value.bfloat16(), k_cache, v_cache, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="contiguous heads"):
        cpu_attention.write_kv(key.transpose(1, 2).contiguous().transpose(1, 2), value, k_cache, v_cache,
                               torch.tensor([0, 1, 2]))
