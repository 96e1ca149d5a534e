"""Build a CausalLM from a preset (random weights) or a local Hugging Face directory (safetensors)."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import PretrainedConfig

from sarathi_lab.attention import AttentionBackend
from sarathi_lab.model.configs import ModelLoadError, first_line, open_weights, weight_files
from sarathi_lab.model.cpu_linear import aten_from_rows, pack_linears, packed_gemm
from sarathi_lab.model.decoder import CausalLM
from sarathi_lab.model.presets import PRESETS

# Our fused parameter <- the Hugging Face parameters stacked into it, in order.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
log = logging.getLogger("sarathi_lab")


def build_model(model: str, config: PretrainedConfig, backend: AttentionBackend, max_positions: int,
                dtype: torch.dtype, device: torch.device, seed: int, cpu_linear: str) -> CausalLM:
    # Parameters are created in their final dtype: built in float32 and cast, a model would take twice
    # its memory at the peak.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            lm = CausalLM(config, backend, max_positions)
    finally:
        torch.set_default_dtype(previous)
    if model in PRESETS:
        _init_random(lm, config, seed)
    else:
        _load_safetensors(lm, Path(model))
    lm = lm.to(dtype).eval()
    if device.type == "cpu" and cpu_linear != "aten":
        gemm = packed_gemm(cpu_linear, dtype)
        if gemm:
            pack_linears(lm, gemm, aten_from_rows(cpu_linear, dtype, gemm))
        else:
            log.warning("cpu_linear=%r runs as 'aten': this torch build's oneDNN cannot run %s on this CPU",
                        cpu_linear, dtype)
    return lm


@torch.no_grad()
def _init_random(lm: CausalLM, config: PretrainedConfig, seed: int) -> None:
    gen = torch.Generator(device=lm.embed_tokens.weight.device).manual_seed(seed)
    std = getattr(config, "initializer_range", 0.02)
    for name, p in lm.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            # Drawn in float32 whatever the dtype: the same weights as a float32 model, rounded.
            p.copy_(torch.empty(p.shape, device=p.device).normal_(0.0, std, generator=gen))


def _our_name(hf_name: str) -> tuple[str, str | None, int]:
    """model.layers.0.self_attn.k_proj.weight -> (layers.0.self_attn.qkv_proj.weight, "qkv_proj", 1)."""
    name = hf_name.removeprefix("model.")
    for fused, parts in _FUSED.items():
        for i, part in enumerate(parts):
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), fused, i
    return name, None, 0


@torch.no_grad()
def _load_safetensors(lm: CausalLM, path: Path) -> None:
    params = dict(lm.named_parameters())
    # The sizes of a fused parameter's shards along dim 0.
    attn, mlp = lm.layers[0].self_attn, lm.layers[0].mlp
    sizes = {"qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size], "gate_up_proj": [mlp.intermediate] * 2}
    filled: dict[str, int] = {}
    for file in weight_files(path):
        with open_weights(path, file) as f:
            for hf_name in f.keys():  # noqa: SIM118 (safetensors' handle is not iterable)
                name, fused, shard = _our_name(hf_name)
                if name not in params:
                    if "rotary_emb" in name:
                        continue
                    raise ModelLoadError(f"model={str(path)!r}: unexpected weight {hf_name}")
                target = params[name].split(sizes[fused])[shard] if fused else params[name]
                try:
                    tensor = f.get_tensor(hf_name)
                except Exception as e:  # noqa: BLE001 - safetensors' own error types
                    raise ModelLoadError(f"model={str(path)!r}: weight {hf_name} in {file.name} cannot be read "
                                         f"({first_line(e)})") from None
                if tensor.shape != target.shape:
                    raise ModelLoadError(f"model={str(path)!r}: weight {hf_name} has shape {tuple(tensor.shape)},"
                                         f" expected {tuple(target.shape)}")
                target.copy_(tensor)
                filled[name] = filled.get(name, 0) + 1
    # A tied lm_head shares the embedding's storage, so it is filled when the embedding is.
    tied = lm.config.tie_word_embeddings
    missing = [n for n in params if not (tied and n == "lm_head.weight")
               and filled.get(n, 0) < len(_FUSED.get(n.split(".")[-2], "?"))]
    if missing:
        raise ModelLoadError(f"model={str(path)!r}: weights missing from the checkpoint: {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
