"""A built model as a Hugging Face checkpoint, the loader's inverse."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from sarathi_lab.model.decoder import CausalLM
from sarathi_lab.model.loader import _FUSED, fused_sizes
from sarathi_lab.model.spec import ModelConfig, hf_config


@torch.no_grad()
def save_checkpoint(lm: CausalLM, config: ModelConfig, directory: Path) -> Path:
    """``lm`` must hold plain parameters (cpu_linear='aten'), not packed ones."""
    sizes, tensors = fused_sizes(lm), {}
    for name, p in lm.named_parameters():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # shares the embedding's storage: the loader fills it from there
        prefix = "" if name.startswith("lm_head.") else "model."
        fused = name.split(".")[-2]
        if fused in _FUSED:
            for part, shard in zip(_FUSED[fused], p.split(sizes[fused])):
                hf_name = prefix + name.replace(f".{fused}.", f".{part}.")
                tensors[hf_name] = shard.contiguous().clone()
        else:
            tensors[prefix + name] = p.detach().contiguous().clone()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf_config(config).save_pretrained(directory)
    return directory
