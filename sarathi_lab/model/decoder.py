"""A LLaMA-family decoder over a flat hybrid batch: only attention sees request boundaries."""
from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from sarathi_lab.attention import AttentionBackend, AttentionMetadata
from sarathi_lab.model.configs import SUPPORTED_ARCHITECTURES
from sarathi_lab.model.layers import GatedMLP, RMSNorm, RotaryEmbedding, TunedLinear
from sarathi_lab.model.nano_batch import overlapped_layers, streams_for
from sarathi_lab.model.shape import head_dim_of, kv_heads_of


class Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding,
                 backend: AttentionBackend):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = kv_heads_of(config)
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = (SUPPORTED_ARCHITECTURES[config.architectures[0]]
                or getattr(config, "attention_bias", False))
        # One matmul for q, k and v: the layer reads the token batch once.
        self.qkv_proj = TunedLinear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = TunedLinear(self.q_size, config.hidden_size, bias=False)
        self.scale = self.head_dim**-0.5
        self.rotary = rotary
        self.backend = backend

    def project(self, positions, hidden, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        k_cache, v_cache = kv_cache
        return self.backend.rope_write_kv(self.rotary, positions, qkv, self.num_heads,
                                          self.num_kv_heads, k_cache, v_cache, meta)

    def attend(self, q, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata):
        return self.backend.attend(q, kv_cache[0], kv_cache[1], meta, self.scale)

    def forward(self, positions, hidden, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata):
        out = self.attend(self.project(positions, hidden, kv_cache, meta), kv_cache, meta)
        return self.o_proj(out.reshape(hidden.shape[0], self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding,
                 backend: AttentionBackend):
        super().__init__()
        self.self_attn = Attention(config, rotary, backend)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, residual, kv_cache, meta):
        hidden, residual = self._norm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def _norm(self, hidden, residual):
        if residual is None:
            return self.input_layernorm(hidden), hidden
        return self.input_layernorm(hidden, residual)

    # The layer in stages, so a nano-batch's attention runs beside the other's GEMMs; forward
    # keeps the module calls that hooks time.
    def pre_attention(self, positions, hidden, residual, kv_cache, meta):
        hidden, residual = self._norm(hidden, residual)
        return self.self_attn.project(positions, hidden, kv_cache, meta), residual

    def post_attention(self, out, residual):
        hidden = self.self_attn.o_proj(out.reshape(out.shape[0], self.self_attn.q_size))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class CausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, max_positions: int):
        super().__init__()
        self.config = config
        self.backend = backend  # the engine plans each iteration's attention through it
        rotary = RotaryEmbedding(config, head_dim_of(config), max_positions)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, rotary, backend)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata, logits_indices: torch.Tensor,
                argmax: bool = False, nano: tuple | None = None) -> torch.Tensor | list[int]:
        """One method for every way (argmax, nano-batches), so hooks see them all."""
        hidden, residual = self.embed_tokens(input_ids), None
        if nano is None:
            for layer, kv_cache in zip(self.layers, kv_caches):
                hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        else:
            streams = streams_for(input_ids.device)
            hidden, residual = overlapped_layers(self.layers, hidden, kv_caches, nano, streams)
        last = self.final_norm(hidden, residual, logits_indices)
        return self.lm_head.argmax(last) if argmax else self.lm_head(last)

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
        """Per token: rows selected first, the add fused into the norm."""
        return self.norm(hidden.index_select(0, rows), residual.index_select(0, rows))[0]

    @property
    def argmax_rows(self) -> int:
        return getattr(self.lm_head, "argmax_rows", 0)
