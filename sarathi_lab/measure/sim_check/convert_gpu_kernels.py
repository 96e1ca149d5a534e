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

from sarathi_lab import cli_args, output_files, provenance
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
WRITER = "python -m sarathi_lab.measure convert_gpu_kernels"
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


def _head(git_dir: Path) -> str:
    done = subprocess.run(["git", "-C", str(git_dir), "rev-parse", "--short=7", "HEAD"],
                          check=False, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _kernels(table: pd.DataFrame) -> str:
    return table.sort_values(list(COLUMNS[:4])).to_csv(index=False, float_format="%.4g")


def converted(vidur: Path, attention: Path) -> dict[str, str]:
    """Each table's text by its path under the kernel tables' folder."""
    out, shapes = {}, []
    for device in DEVICES:
        for vidur_name, (name, layers) in MODELS.items():
            raw = _git_csv(vidur, f"data/profiling/compute/{device}/{vidur_name}/mlp.csv")
            if raw is None:
                continue
            table = convert_mlp(raw)
            if (device, name) == ("a100", "llama2-7b"):
                table = pd.concat([table, convert_attention(pd.read_csv(attention))],
                                  ignore_index=True)
            out[f"{device}/{name}.csv"] = _kernels(table)
            shape = {ours: raw.iloc[0][theirs] for theirs, ours in SHAPE_COLUMNS.items()}
            shapes.append({"model": name, "layers": layers} | shape)
            print(f"{device}/{name}: {len(table)} rows")
            for tp in SHARD_TPS:
                if (raw.num_tensor_parallel_workers == tp).any():
                    out[f"{device}/tp{tp}/{name}.csv"] = _kernels(convert_mlp(raw, tp))
    if not shapes:
        return {}
    shapes = pd.DataFrame(shapes).astype({"gated": bool})
    out["models.csv"] = shapes.drop_duplicates("model").to_csv(index=False)
    raws = {device: _git_csv(vidur, f"data/profiling/network/{node}/all_reduce.csv")
            for device, node in ALL_REDUCE_NODES.items()}
    reduces = [convert_all_reduce(raw, device) for device, raw in raws.items() if raw is not None]
    if reduces:
        table = pd.concat(reduces, ignore_index=True).sort_values(list(ALL_REDUCE_COLUMNS[:3]))
        out["all_reduce.csv"] = table.to_csv(index=False, float_format="%.4g")
        print(f"all_reduce: {len(table)} rows")
    return out


def main(argv: list[str] | None = None) -> None:
    p = cli_args.Parser(prog="python -m sarathi_lab.measure convert_gpu_kernels",
                        description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vidur", type=Path, required=True,
                   help="a clone (or bare git dir) of microsoft/vidur")
    p.add_argument("--attention", type=Path, required=True, help="a100_llama2_7b_attention.csv")
    cli_args.shared(p, out="the simulator's kernel tables' folder", out_default=DATA_DIR,
                    force="replace tables of another provenance")
    args = p.parse_args(argv)
    if not args.attention.is_file():
        p.error(f"--attention={args.attention} is invalid: no such file")
    made = provenance.Provenance("measured GPU: vidur's kernel profiles, converted",
                                 commit=_head(args.vidur), writer=WRITER)
    given, how = f"--out={args.out}", "--force replaces them; --out DIR writes elsewhere"
    try:
        output_files.Outputs(args.out, {}, given=given).check()
        texts = converted(args.vidur, args.attention)
        if not texts:
            p.error(f"--vidur={args.vidur} is invalid: its HEAD holds no "
                    "data/profiling/compute/<device>/<model>/mlp.csv of a model converted here")
        out = output_files.Outputs(args.out, dict.fromkeys(texts, made), given=given,
                                   force=args.force, how=how)
        for name, text in texts.items():
            out.add(name, text)
        out.write()
    except ValueError as e:
        p.error(str(e))
    except (KeyError, AttributeError, pd.errors.ParserError, UnicodeDecodeError) as e:
        p.error(f"--vidur={args.vidur} or --attention={args.attention} is invalid: a table lacks "
                f"what is converted ({type(e).__name__}: {e})")

