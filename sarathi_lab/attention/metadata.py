"""What one forward pass needs to know about its hybrid batch, as tensors: prefill chunks first,
then one token per decode. Request ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]``
and its first ``seq_lens[i]`` cache slots."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    num_prefills: int
    num_decodes: int
    num_prefill_tokens: int
    # int32 [R + 1]: cumulative query lengths, prefills first.
    query_start_loc: torch.Tensor
    # int32 [R]: context length of each request including this step's tokens.
    seq_lens: torch.Tensor
    # int32 [R, max_blocks]: physical block ids, 0 past each request's last block.
    block_tables: torch.Tensor
    # int64 [T]: the cache slot (block * block_size + offset) of each token's key/value.
    slot_mapping: torch.Tensor
    # Host copies: the torch backend loops over prefills in Python and must not sync per request.
    query_lens_host: list[int]
    seq_lens_host: list[int]
    max_query_len: int
    # What the backend derives once per iteration and every layer reuses (AttentionBackend.plan).
    plan: Any = None

    @property
    def kv_tokens_read(self) -> int:
        """Cached keys/values attention reads per layer: every request reads its whole context."""
        return sum(self.seq_lens_host)
