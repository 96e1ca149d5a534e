"""A decoder's shape and arithmetic: the one home for memory plan, simulator and floors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig


def head_dim_of(config: ModelConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_heads_of(config: ModelConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


# Hugging Face model types whose MLP is plain (up, activation, down): no gate projection.
PLAIN_MLP_TYPES = frozenset({"phi", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "falcon",
                             "bloom", "mpt", "starcoder2"})


def is_gated(config: ModelConfig) -> bool:
    """vidur's measured shapes say plain by gelu_new, as phi-2's."""
    return (getattr(config, "model_type", None) not in PLAIN_MLP_TYPES
            and getattr(config, "hidden_act", "silu") != "gelu_new")


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    gated: bool = True

    @classmethod
    def of(cls, config: ModelConfig) -> Shape:
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                   config.num_attention_heads, kv_heads_of(config), head_dim_of(config),
                   config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)),
                   is_gated(config))

    @property
    def gemms(self) -> dict[str, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"qkv_proj": (self.hidden, q + 2 * kv), "o_proj": (q, self.hidden),
                "gate_up_proj": (self.hidden, (2 if self.gated else 1) * self.intermediate),
                "down_proj": (self.intermediate, self.hidden)}

    @property
    def layer_linear_params(self) -> int:
        return sum(k * n for k, n in self.gemms.values())

    @property
    def num_parameters(self) -> int:
        per_layer = self.layer_linear_params + 2 * self.hidden  # two RMSNorm weights
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden  # the final norm

    def weight_bytes(self, elem_bytes: int) -> int:
        return self.num_parameters * elem_bytes

    def kv_bytes_per_token(self, elem_bytes: int, layers: int | None = None) -> int:
        return (kv_token_bytes(self.kv_heads, self.head_dim, elem_bytes)
                * (self.layers if layers is None else layers))

    @property
    def attention_flops_per_pair(self) -> int:
        return attention_flops_per_pair(self.heads, self.head_dim)

    def elementwise_bytes_per_token(self, elem_bytes: int) -> dict[str, int]:
        """One layer's elementwise passes per token, as the engine fuses them."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"norms": 2 * 4 * self.hidden * elem_bytes,
                "rope_kv_write": 2 * (q + 2 * kv) * elem_bytes,
                "activation": (3 if self.gated else 2) * self.intermediate * elem_bytes}

    def activation_bytes_per_token(self, elem_bytes: int) -> int:
        """Peak per token; float32 logits for every token are an upper bound."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = (3 if self.gated else 2) * self.intermediate
        return (2 * self.hidden + q + 2 * kv + mlp) * elem_bytes + 4 * self.vocab


def kv_token_bytes(kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    return 2 * kv_heads * head_dim * elem_bytes


def attention_flops_per_pair(heads: int, head_dim: int) -> int:
    return 4 * heads * head_dim


def visible_pairs(query_len: int, context_len: int) -> int:
    before = context_len - query_len
    return query_len * before + query_len * (query_len + 1) // 2


def attention_cost(heads: int, kv_heads: int, head_dim: int, query_lens: list[int],
                   context_lens: list[int], elem_bytes: int) -> tuple[float, float]:
    """(flops, bytes) of one layer's attention, the least a kernel moves."""
    pairs = sum(visible_pairs(q, c) for q, c in zip(query_lens, context_lens))
    flops = attention_flops_per_pair(heads, head_dim) * pairs
    kv = kv_token_bytes(kv_heads, head_dim, elem_bytes) * sum(context_lens)
    query_and_output = 2 * heads * head_dim * elem_bytes * sum(query_lens)
    return float(flops), float(kv + query_and_output)


def iteration_cost(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
                   elem_bytes: int) -> tuple[float, float]:
    """(flops, bytes) the least an iteration must do."""
    tokens = sum(query_lens)
    s = shape
    linear_flops = 2 * tokens * s.layer_linear_params * s.layers
    attn_flops = s.layers * attention_cost(s.heads, s.kv_heads, s.head_dim, query_lens,
                                           context_lens, elem_bytes)[0]
    head_flops = 2 * num_sampled * s.hidden * s.vocab
    weight_bytes = s.layer_linear_params * s.layers * elem_bytes
    weight_bytes += (s.hidden * s.vocab * elem_bytes) if num_sampled else 0
    weight_bytes += tokens * s.hidden * elem_bytes  # embedding rows
    # Read every context, write this step's keys/values.
    kv_bytes = s.kv_bytes_per_token(elem_bytes) * (sum(context_lens) + tokens)
    return float(linear_flops + attn_flops + head_flops), float(weight_bytes + kv_bytes)


def kernel_costs(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
                 elem_bytes: int) -> dict[str, tuple[float, float]]:
    """Bytes exceed ``iteration_cost``'s by what a fused iteration could keep on chip."""
    tokens, s = sum(query_lens), shape
    costs = {name: (2.0 * tokens * k * n * s.layers,
                    float((k * n + tokens * (k + n)) * elem_bytes * s.layers))
             for name, (k, n) in s.gemms.items()}
    attn = attention_cost(s.heads, s.kv_heads, s.head_dim, query_lens, context_lens, elem_bytes)
    costs["attention"] = (attn[0] * s.layers, attn[1] * s.layers)
    costs["kv_write"] = (0.0, float(s.kv_bytes_per_token(elem_bytes) * tokens))
    costs["embedding"] = (0.0, float(2 * tokens * s.hidden * elem_bytes))
    if num_sampled:
        costs["lm_head"] = (2.0 * num_sampled * s.hidden * s.vocab,
                            float((s.hidden * s.vocab + num_sampled * (s.hidden + s.vocab))
                                  * elem_bytes))
    return costs
