"""Which part of every weight a tensor-parallel rank holds, Megatron-style (KV heads fewer than the
ranks replicated): the one home of the split, for shapes, the memory plan and the weights."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sarathi_lab.config import ConfigError, Key
from sarathi_lab.model.shape import head_dim_of, kv_heads_of

if TYPE_CHECKING:
    import torch

    from sarathi_lab.model.spec import ModelConfig


@dataclass(frozen=True)
class TensorShards:
    rank: int
    size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: ModelConfig, rank: int, size: int, model: str = "",
           pad_vocab: bool = False) -> TensorShards:
        """``pad_vocab``: an uneven vocabulary is padded, as vLLM pads it, not refused."""
        heads, kv, of = config.num_attention_heads, kv_heads_of(config), Key("model", model)
        counts = {"attention heads": heads,
                  "MLP columns (intermediate_size)": config.intermediate_size,
                  **({} if pad_vocab else {"vocabulary entries": config.vocab_size})}
        for what, n in counts.items():
            if n % size:
                raise ConfigError("tensor_parallel", size, "is invalid for " + of
                                  + f": its {n} {what} do not split evenly across {size} ranks",
                                  f"a divisor of {n}")
        if kv % size and size % kv:
            raise ConfigError("tensor_parallel", size, "is invalid for " + of
                              + f": its {kv} KV heads neither split across {size} ranks nor "
                              "replicate evenly on them", f"a divisor or a multiple of {kv}")
        return cls(rank, size, heads, kv, head_dim_of(config), config.intermediate_size,
                   config.vocab_size)

    @property
    def local_heads(self) -> int:
        return self.heads // self.size

    @property
    def local_kv_heads(self) -> int:
        return max(self.kv_heads // self.size, 1)

    @property
    def first_head(self) -> int:
        return self.rank * self.local_heads

    @property
    def first_kv_head(self) -> int:
        # Fewer KV heads than ranks: each KV head's query heads span whole ranks.
        if self.kv_heads >= self.size:
            return self.rank * self.local_kv_heads
        return self.rank // (self.size // self.kv_heads)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        local = copy.deepcopy(config)
        local.num_attention_heads = self.local_heads
        local.num_key_value_heads = self.local_kv_heads
        local.intermediate_size = self.intermediate // self.size
        local.head_dim = self.head_dim
        return local

    # Rows (dim 0) of the output-split weights, columns of the others.
    def _heads(self, first: int, count: int) -> slice:
        return slice(first * self.head_dim, (first + count) * self.head_dim)

    def q_rows(self) -> slice:
        return self._heads(self.first_head, self.local_heads)

    def kv_rows(self) -> slice:
        return self._heads(self.first_kv_head, self.local_kv_heads)

    def mlp_rows(self) -> slice:
        n = self.intermediate // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def vocab_rows(self) -> slice:
        n = self.vocab // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        import torch  # here: the memory plan (the simulator's too) reads only shapes

        if self.size == 1:
            return full  # one rank holds it all: the cuts below would only copy it
        kind = name.split(".")[-2] if "." in name else name
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        fused = {"qkv_proj": [q, kv, kv], "gate_up_proj": [self.intermediate] * 2}
        if kind in fused:  # weight [q + 2 kv, hidden] or bias [q + 2 kv]; gate and up
            return torch.cat([self.shard_part(kind, i, part)
                              for i, part in enumerate(full.split(fused[kind]))])
        if kind in ("o_proj", "down_proj"):
            return full[:, self.q_rows() if kind == "o_proj" else self.mlp_rows()]
        return full[self.vocab_rows()] if kind == "lm_head" else full

    def shard_part(self, fused: str, index: int, full: torch.Tensor) -> torch.Tensor:
        if fused == "qkv_proj":
            return full[self.q_rows() if index == 0 else self.kv_rows()]
        return full[self.mlp_rows()]


def rank_memory_config(config: ModelConfig, size: int, model: str = "") -> ModelConfig:
    """The vocabulary whole and untied: an upper bound, as the logits are gathered."""
    local = TensorShards.of(config, 0, size, model).local_config(config)
    local.tie_word_embeddings = False
    return local
