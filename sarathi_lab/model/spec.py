"""A decoder's architecture as plain data under Hugging Face's attribute names: readers take it or a
transformers config alike, and the simulator never imports transformers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ARCHITECTURE_OF = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}


# Not frozen: sharding copies a config and sets its per-GPU sizes, as on a transformers one.
@dataclass
class ModelSpec:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    # None: hidden_size / num_attention_heads, as transformers derives it.
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    # LLaMA's </s>, transformers' default for these configs.
    eos_token_id: int | None = 2

    def __post_init__(self):
        if self.model_type not in ARCHITECTURE_OF:
            raise ValueError(f"model_type={self.model_type!r} is invalid: allowed "
                             f"{', '.join(ARCHITECTURE_OF)}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def architectures(self) -> list[str]:
        return [ARCHITECTURE_OF[self.model_type]]

    def to_hf(self) -> PretrainedConfig:
        from transformers import LlamaConfig, MistralConfig

        config_class = {"llama": LlamaConfig, "mistral": MistralConfig}[self.model_type]
        window = {"sliding_window": self.sliding_window} if self.model_type == "mistral" else {}
        config = config_class(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                              intermediate_size=self.intermediate_size,
                              num_hidden_layers=self.num_hidden_layers,
                              num_attention_heads=self.num_attention_heads,
                              num_key_value_heads=self.num_key_value_heads,
                              max_position_embeddings=self.max_position_embeddings,
                              head_dim=self.head_dim, tie_word_embeddings=self.tie_word_embeddings,
                              hidden_act=self.hidden_act, rope_theta=self.rope_theta,
                              eos_token_id=self.eos_token_id, **window)
        config.architectures = self.architectures
        return config


ModelConfig = Union[ModelSpec, "PretrainedConfig"]


def hf_config(config: ModelConfig) -> PretrainedConfig:
    return config.to_hf() if isinstance(config, ModelSpec) else config
