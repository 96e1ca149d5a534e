"""Named model shapes, the one home of their numbers; weights random: the results need shapes."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING

from sarathi_lab.model.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
           context: int = 4096, vocab: int = 32000, model_type: str = "llama",
           **extra) -> ModelSpec:
    return ModelSpec(model_type, hidden, intermediate, layers, heads, kv_heads, vocab, context,
                     **extra)


SPECS: dict[str, ModelSpec] = {
    "tiny": _llama(256, 688, 4, 4, 2, context=2048, vocab=4096),
    # ~110M: on a CPU a decode token costs several prefill tokens, as on a GPU; MHA as LLaMA-13B.
    "cpu-small": _llama(768, 2048, 12, 12, 12, tie_word_embeddings=True),
    # The papers' shapes (LLaMA-2 context, so that the 1K-3K sweeps fit).
    "llama2-7b": _llama(4096, 11008, 32, 32, 32),
    "llama-13b": _llama(5120, 13824, 40, 40, 40),
    "llama-33b": _llama(6656, 17920, 60, 52, 52),
    "mistral-7b": _llama(4096, 14336, 32, 32, 8, context=32768, model_type="mistral",
                         sliding_window=None, rope_theta=1e6),
    # Sarathi-Serve's second model: 01-ai/Yi-34B's config.json.
    "yi-34b": _llama(7168, 20480, 60, 56, 8, vocab=64000, rope_theta=5e6),
    # Sarathi-Serve's third: meta-llama/Llama-2-70b-hf's config.json.
    "llama2-70b": _llama(8192, 28672, 80, 64, 8, rope_theta=10000.0),
    # Sarathi-Serve's fourth, simulator only: falcon-180B in the LLaMA form the cost models price;
    # its GELU MLP of 4 x hidden as a gated one of 39592 columns (split by 2, 4 and 8 ranks): the
    # same FLOPs and weight bytes per token.
    "falcon-180b": _llama(14848, 39592, 80, 232, 8, context=2048, vocab=65024),
}

SIMULATED_ONLY: dict[str, str] = {
    "falcon-180b": "Falcon's decoder (attention and MLP in parallel, LayerNorm, a non-gated GELU "
                   "MLP) is not built by this engine, whose decoder is LLaMA's; the preset is its "
                   "cost-equivalent LLaMA form",
}


class _TransformersConfigs(Mapping):

    def __getitem__(self, name: str) -> PretrainedConfig:
        return _hf(name)

    def __contains__(self, name: object) -> bool:  # Mapping's would build the config to answer
        return name in SPECS

    def __iter__(self) -> Iterator[str]:
        return iter(SPECS)

    def __len__(self) -> int:
        return len(SPECS)


@cache
def _hf(name: str) -> PretrainedConfig:
    return SPECS[name].to_hf()


PRESETS: Mapping[str, PretrainedConfig] = _TransformersConfigs()
