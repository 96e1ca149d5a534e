"""Next-token choice from the logits of the requests that reached the end of their tokens."""
from __future__ import annotations

import torch
from sarathi_kernels import cpu_ops

from sarathi_lab.engine.sequence import SamplingParams


class Sampler:
    def __init__(self, params: SamplingParams, device: torch.device):
        self.params = params
        self.generator = None
        if params.temperature > 0:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed if params.seed is not None else 0)

    def __call__(self, logits: torch.Tensor) -> list[int]:
        if self.generator is None:
            # torch's CPU argmax is scalar code: 0.4 ms of a decode iteration's host work at 16 x 32000.
            if cpu_ops.supports(logits) and logits.is_contiguous():
                return cpu_ops.argmax(logits)
            return logits.argmax(dim=-1).tolist()
        logits = logits.float()
        # Shifted to a maximum of 0 before dividing: logits / T overflows to inf (softmax: NaN) for a
        # tiny T, where (logits - max) / T only reaches -inf, which softmax takes as probability 0.
        # T is divided as a float32, where below float32's smallest normal it would round to 0 (0 / 0).
        shifted = logits - logits.amax(dim=-1, keepdim=True)
        temperature = max(self.params.temperature, torch.finfo(torch.float32).tiny)
        probs = torch.softmax(shifted / temperature, dim=-1)
        if self.params.top_p < 1.0:
            probs = _top_p(probs, self.params.top_p)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1).tolist()


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (always the top one)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)
