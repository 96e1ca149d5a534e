"""A CausalLM from a preset (random weights) or a local Hugging Face directory (safetensors)."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PretrainedConfig

from sarathi_lab.attention import AttentionBackend
from sarathi_lab.config import AS_WRITTEN
from sarathi_lab.model.configs import ModelLoadError, first_line, open_weights, weight_files
from sarathi_lab.model.cpu_linear import PackedLinear, aten_from_rows, pack_linears, packed_gemm
from sarathi_lab.model.decoder import CausalLM
from sarathi_lab.model.layers import RotaryEmbedding
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.presets import SPECS
from sarathi_lab.model.shape import head_dim_of
from sarathi_lab.model.spec import ModelConfig, hf_config

_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
log = logging.getLogger("sarathi_lab")


def build_model(model: str, config: ModelConfig, backend: AttentionBackend, max_positions: int,
                dtype: torch.dtype, device: torch.device, seed: int, cpu_linear: str,
                shards: TensorShards | None = None, stage: Stage | None = None) -> CausalLM:
    """A rank's part has the very weights the whole model would have."""
    config = hf_config(config)
    if stage is not None and shards is None:
        shards = TensorShards.of(config, 0, 1, model)
    with _building(dtype, device):
        local = config if shards is None else shards.local_config(config)
        if stage is not None:
            local.num_hidden_layers = stage.num_layers
        lm = CausalLM(local, backend, max_positions)
        if shards is not None:  # untied: the rank's rows only
            lm.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size // shards.size,
                                         bias=False)
    if model in SPECS:
        _init_random(lm, config, seed, shards or TensorShards.of(config, 0, 1, model), backend,
                     max_positions, stage)
    else:
        _load_safetensors(lm, Path(model), shards, stage)
    lm = lm.to(dtype).eval()
    if device.type == "cpu" and cpu_linear != "aten":
        gemm = packed_gemm(cpu_linear, dtype)
        if gemm:
            pack_linears(lm, gemm, aten_from_rows(cpu_linear, dtype, gemm))
        else:
            log.warning("cpu_linear=%r runs as 'aten': this torch build's oneDNN cannot run %s on "
                        "this CPU", cpu_linear, dtype)
    return lm


@contextmanager
def _building(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Tensors created in the final dtype, on the device: built in float32 and cast, a model would
    peak at twice its size."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def rotary_for(config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_positions: int) -> RotaryEmbedding:
    """The rotary tables build_model makes for a context of ``max_positions``, bit for bit."""
    config = hf_config(config)
    with _building(dtype, device):
        return RotaryEmbedding(config, head_dim_of(config), max_positions)


@torch.no_grad()
def reseed(lm: CausalLM, model: str, seed: int) -> bool:
    """A preset's weights drawn again in place for ``seed``: the values build_model draws, in the
    same tensors, so CUDA graphs captured over them stay valid; False for a checkpoint's weights,
    which no seed changes."""
    if model not in SPECS:
        return False
    config = lm.config
    max_positions = lm.layers[0].self_attn.rotary.cos.shape[0]
    _init_random(lm, config, seed, TensorShards.of(config, 0, 1, model), lm.backend, max_positions)
    for module in lm.modules():
        if isinstance(module, PackedLinear):
            module.repack()
    return True


@torch.no_grad()
def _init_random(lm: CausalLM, config: PretrainedConfig, seed: int, shards: TensorShards,
                 backend: AttentionBackend, max_positions: int, stage: Stage | None = None) -> None:
    """The whole model's draws in order, each cut: a rank's weights are one device's."""
    gen = torch.Generator(device=lm.embed_tokens.weight.device).manual_seed(seed)
    std = getattr(config, "initializer_range", 0.02)
    with torch.device("meta"):  # names and shapes, nothing allocated
        whole = CausalLM(config, backend, max_positions)
    local = dict(lm.named_parameters())
    tied = config.tie_word_embeddings
    for name, p in whole.named_parameters():
        mine = name if stage is None else stage.local_name(name)
        if name.endswith("layernorm.weight") or name == "norm.weight":
            if mine is not None:
                local[mine].fill_(1.0)
        elif name.endswith("bias"):
            if mine is not None:
                local[mine].zero_()
        else:
            target = local.get(mine) if mine is not None else None
            if shards.size == 1 and target is not None and _whole_float32(target, p, gen):
                # Drawn where it is kept: the same draws as into a fresh tensor, no copy.
                drawn = target.normal_(0.0, std, generator=gen)
            else:
                # Drawn in float32 whatever the dtype: the same weights as a float32 model, rounded.
                drawn = torch.empty(p.shape, device=gen.device).normal_(0.0, std, generator=gen)
                if target is not None:
                    target.copy_(shards.shard(name, drawn))
            # A rank's LM head is its own; one model's tied head is its embedding.
            if tied and name == "embed_tokens.weight" and "lm_head.weight" in local:
                local["lm_head.weight"].copy_(shards.shard("lm_head", drawn))


def _whole_float32(target: torch.Tensor, whole: torch.Tensor, gen: torch.Generator) -> bool:
    return (target.dtype == torch.float32 and target.shape == whole.shape
            and target.device == gen.device and target.is_contiguous())


def fused_sizes(lm: CausalLM) -> dict[str, list[int]]:
    attn, mlp = lm.layers[0].self_attn, lm.layers[0].mlp
    return {"qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size],
            "gate_up_proj": [mlp.intermediate] * 2}


def _our_name(hf_name: str) -> tuple[str, str | None, int]:
    name = hf_name.removeprefix("model.")
    for fused, parts in _FUSED.items():
        for i, part in enumerate(parts):
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), fused, i
    return name, None, 0


@torch.no_grad()
def _load_safetensors(lm: CausalLM, path: Path, shards: TensorShards | None = None,
                      stage: Stage | None = None) -> None:
    params, sizes = dict(lm.named_parameters()), fused_sizes(lm)
    filled: dict[str, int] = {}
    for file in weight_files(path):
        with open_weights(path, file) as f:
            for hf_name in f.keys():  # noqa: SIM118 (safetensors' handle is not iterable)
                name, fused, shard = _our_name(hf_name)
                if stage is not None:
                    name = stage.local_name(name)
                    if name is None:
                        continue
                if name not in params:
                    if "rotary_emb" in name:
                        continue
                    raise ModelLoadError("model", str(path), f": unexpected weight {hf_name}",
                                         keys=AS_WRITTEN)
                target = params[name].split(sizes[fused])[shard] if fused else params[name]
                try:
                    tensor = f.get_tensor(hf_name)
                except Exception as e:  # noqa: BLE001 - safetensors' own error types
                    raise ModelLoadError("model", str(path), f": weight {hf_name} in {file.name} "
                                         f"cannot be read ({first_line(e)})",
                                         keys=AS_WRITTEN) from None
                if shards is not None:
                    tensor = (shards.shard_part(fused, shard, tensor) if fused
                              else shards.shard(name, tensor))
                if tensor.shape != target.shape:
                    raise ModelLoadError("model", str(path), f": weight {hf_name} has shape "
                                         f"{tuple(tensor.shape)}, expected {tuple(target.shape)}",
                                         keys=AS_WRITTEN)
                target.copy_(tensor)
                # The embedding is whole: the rank's LM head rows come from it.
                if (shards is not None and lm.config.tie_word_embeddings
                        and name == "embed_tokens.weight"):
                    params["lm_head.weight"].copy_(shards.shard("lm_head", tensor))
                filled[name] = filled.get(name, 0) + 1
    # A tied lm_head shares the embedding's storage, so it is filled when the embedding is.
    tied = lm.config.tie_word_embeddings
    missing = [n for n in params if not (tied and n == "lm_head.weight")
               and filled.get(n, 0) < len(_FUSED.get(n.split(".")[-2], "?"))]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError("model", str(path), f": weights missing from the checkpoint: "
                             f"{', '.join(missing[:5])}{more}", keys=AS_WRITTEN)
