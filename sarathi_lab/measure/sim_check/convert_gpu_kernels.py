"""Converts the vidur project's measured GPU kernel profiles into the simulator's kernel tables,
once: ``python -m sarathi_lab.measure convert_gpu_kernels --vidur <vidur git dir>
--attention <csv>``
(what is kept and why: data/gpu_kernels/README.md)."""
from __future__ import annotations

import argparse
import subprocess
from io import StringIO
from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args
from sarathi_lab.sim.gpu_kernels import DATA_DIR
from sarathi_lab.sim.profile_model import COLUMNS

# ``emb`` runs once per forward, all others once a layer.
VIDUR_OPS = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "gate_up_proj",
             "mlp_down_proj": "down_proj", "mlp_act": "act", "attn_rope": "rope",
             "input_layernorm": "input_norm", "post_attention_layernorm": "post_attention_norm",
             "add": "add", "emb": "embedding"}
# vidur's directory -> (name here, decoder layers, which mlp.csv does not hold).
MODELS = {"meta-llama/Llama-2-7b-hf": ("llama2-7b", 32),
          "meta-llama/Llama-2-70b-hf": ("llama2-70b", 80),
          "codellama/CodeLlama-34b-Instruct-hf": ("codellama-34b", 48),
          "internlm/internlm-20b": ("internlm-20b", 60), "Qwen/Qwen-72B": ("qwen-72b", 80),
          "microsoft/phi-2": ("phi-2", 32), "meta-llama/Meta-Llama-3-8B": ("llama3-8b", 32),
          "meta-llama/Meta-Llama-3-70B": ("llama3-70b", 80)}
DEVICES = ("a100", "h100", "a40")
# A DGX, whose every GPU pair is on NVLink (data/gpu_kernels/README.md).
ALL_REDUCE_NODES = {"a100": "a100_dgx", "h100": "h100_dgx"}
ALL_REDUCE_COLUMNS = ("device", "tp", "bytes", "seconds")
# The degrees the papers serve with.
SHARD_TPS = (2, 4)
SHAPE_COLUMNS = {"n_head": "heads", "n_kv_head": "kv_heads", "n_embd": "hidden",
                 "n_expanded_embd": "intermediate", "vocab_size": "vocab", "use_gated_mlp": "gated"}


def kept_tokens(tokens: int) -> bool:
    """Every count up to 1024 (the tile steps), multiples of 64 beyond."""
    return tokens <= 1024 or tokens % 64 == 0


def kept_bytes(size: int) -> bool:
    """Every size up to 1 MiB (latency gives way to bandwidth), coarser beyond."""
    mib = 1 << 20
    return size <= mib or (size <= 16 * mib and size % (mib // 4) == 0) or size % mib == 0


def convert_all_reduce(raw: pd.DataFrame, device: str) -> pd.DataFrame:
    """The median over repeated sizes, ms to s."""
    median = "time_stats.all_reduce.median"
    rows = raw[(raw.collective == "all_reduce") & (raw.num_workers == raw.devices_per_node)]
    rows = rows.drop_duplicates()
    times = rows.groupby(["num_workers", "size"])[median].median().dropna().reset_index()
    times = times[[kept_bytes(int(b)) for b in times["size"]]]
    return pd.DataFrame({"device": device, "tp": times.num_workers.astype(int),
                         "bytes": times["size"].astype(int),
                         "seconds": times[median].to_numpy() / 1e3})[list(ALL_REDUCE_COLUMNS)]


def convert_mlp(raw: pd.DataFrame, tp: int = 1) -> pd.DataFrame:
    """The median of one GPU's rows out of ``tp``, ms to s."""
    rows = raw[raw.num_tensor_parallel_workers == tp].drop_duplicates()
    out = []
    for vidur_op, op in VIDUR_OPS.items():
        column = f"time_stats.{vidur_op}.median"
        if column not in rows.columns:
            continue  # phi-2 has no post-attention norm
        times = rows.groupby("num_tokens")[column].median().dropna()
        times = times[[kept_tokens(int(t)) for t in times.index]]
        out.append(pd.DataFrame({"op": op, "tokens": times.index.astype(int), "context": 0,
                                 "batch": 0, "seconds": times.to_numpy() / 1e3}))
    return pd.concat(out, ignore_index=True)[list(COLUMNS)]


def convert_attention(raw: pd.DataFrame) -> pd.DataFrame:
    """Chunks as (tokens, context once cached); decodes as (count, context with the new token)."""
    pre = raw[raw.kind == "prefill"]
    dec = raw[raw.kind == "decode"]
    prefill = pd.DataFrame({"op": "prefill_attention", "tokens": pre.prefill_chunk_size,
                            "context": pre.kv_cache_size + pre.prefill_chunk_size, "batch": 1,
                            "seconds": pre.median_ms / 1e3})
    decode = pd.DataFrame({"op": "decode_attention", "tokens": dec.batch_size,
                           "context": dec.kv_cache_size + 1, "batch": dec.batch_size,
                           "seconds": dec.median_ms / 1e3})
    both = pd.concat([prefill, decode], ignore_index=True)
    return both.groupby(list(COLUMNS[:4]), as_index=False).seconds.median()[list(COLUMNS)]


def _git_csv(git_dir: Path, path: str) -> pd.DataFrame | None:
    done = subprocess.run(["git", "-C", str(git_dir), "show", f"HEAD:{path}"], check=False,
                          capture_output=True, text=True)
    return pd.read_csv(StringIO(done.stdout)) if done.returncode == 0 else None


def write(table: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table.sort_values(list(COLUMNS[:4])).to_csv(path, index=False, float_format="%.4g")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sarathi_lab.measure convert_gpu_kernels",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vidur", type=Path, required=True,
                   help="a clone (or bare git dir) of microsoft/vidur")
    p.add_argument("--attention", type=Path, required=True, help="a100_llama2_7b_attention.csv")
    cli_args.shared(p, out="the simulator's kernel tables' folder", out_default=DATA_DIR)
    args = p.parse_args(argv)
    shapes = []
    for device in DEVICES:
        for vidur_name, (name, layers) in MODELS.items():
            raw = _git_csv(args.vidur, f"data/profiling/compute/{device}/{vidur_name}/mlp.csv")
            if raw is None:
                continue
            table = convert_mlp(raw)
            if (device, name) == ("a100", "llama2-7b"):
                table = pd.concat([table, convert_attention(pd.read_csv(args.attention))],
                                  ignore_index=True)
            write(table, args.out / device / f"{name}.csv")
            shape = {ours: raw.iloc[0][theirs] for theirs, ours in SHAPE_COLUMNS.items()}
            shapes.append({"model": name, "layers": layers} | shape)
            print(f"{device}/{name}: {len(table)} rows")
            for tp in SHARD_TPS:
                if (raw.num_tensor_parallel_workers == tp).any():
                    write(convert_mlp(raw, tp), args.out / device / f"tp{tp}" / f"{name}.csv")
    shapes = pd.DataFrame(shapes).astype({"gated": bool})
    shapes.drop_duplicates("model").to_csv(args.out / "models.csv", index=False)
    raws = {device: _git_csv(args.vidur, f"data/profiling/network/{node}/all_reduce.csv")
            for device, node in ALL_REDUCE_NODES.items()}
    reduces = [convert_all_reduce(raw, device) for device, raw in raws.items() if raw is not None]
    if reduces:
        table = pd.concat(reduces, ignore_index=True).sort_values(list(ALL_REDUCE_COLUMNS[:3]))
        table.to_csv(args.out / "all_reduce.csv", index=False, float_format="%.4g")
        print(f"all_reduce: {len(table)} rows")
