"""Next-token choice, each draw keyed by (seed, request, position): tokens never depend on batch."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from sarathi_kernels import cpu_ops

from sarathi_lab.engine.sequence import SamplingParams

_MASK = 2**64 - 1


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = params.seed if params.seed is not None else 0
        self.greedy = params.temperature == 0
        # T divides as float32: below its smallest normal it would round to 0 (0 / 0).
        self.temperature = max(params.temperature, torch.finfo(torch.float32).tiny)

    def __call__(self, logits: torch.Tensor,
                 keys: Sequence[tuple[int, int]] | None = None) -> list[int]:
        if self.greedy:
            # torch's CPU argmax is scalar code.
            if cpu_ops.supports(logits) and logits.is_contiguous():
                return cpu_ops.argmax(logits)
            return logits.argmax(dim=-1).tolist()
        if keys is None or len(keys) != logits.shape[0]:
            raise ValueError(f"sampling needs one (request, position) key per row: "
                             f"{logits.shape[0]} rows, keys {None if keys is None else len(keys)}")
        uniforms = [uniform(self.seed, request, position) for request, position in keys]
        if cpu_ops.supports(logits) and logits.is_contiguous():
            # torch_draw's draw in one kernel (csrc/sample_cpu.cpp), the nucleus without a sort.
            tokens = cpu_ops.sample(logits, self.temperature, self.params.top_p, uniforms)
            if tokens is not None:
                return tokens
        return self.torch_draw(logits, uniforms)

    def torch_draw(self, logits: torch.Tensor, uniforms: list[float]) -> list[int]:
        logits = logits.float()
        # Shifted to a maximum of 0 first: for a tiny T, logits / T overflows to inf; (logits - max)
        # / T only reaches -inf.
        shifted = logits - logits.amax(dim=-1, keepdim=True)
        probs = torch.softmax(shifted / self.temperature, dim=-1)
        # NaN or +inf logits, or a row of -inf only, leave NaN: the search would leave the row.
        if bool(torch.isnan(probs).any()):
            raise ValueError(f"sampling: logits rows "
                             f"{torch.isnan(probs).any(dim=-1).nonzero().flatten().tolist()} "
                             "hold NaN or +inf, or only -inf: no distribution to sample from")
        order = None
        if self.params.top_p < 1.0:
            probs, order, cdf, kept = _most_likely(probs, logits, self.params.top_p)
            total = cdf.gather(-1, kept - 1)
        else:
            cdf = probs.cumsum(dim=-1)
            total = cdf[:, -1:]
        u = torch.tensor(uniforms, dtype=torch.float32).to(logits.device).unsqueeze(1)
        # Strictly below the nucleus' mass, so the search lands inside it however u * total rounds;
        # right=True skips tokens of probability 0.
        x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
        chosen = torch.searchsorted(cdf, x, right=True)
        if order is not None:
            chosen = order.gather(-1, chosen)
        return chosen.squeeze(1).tolist()


class Samples:
    """Greedy until ``start`` gives a call's parameters."""
    sampler = Sampler(SamplingParams())

    def start(self, sampling: SamplingParams) -> None:
        self.sampler = Sampler(sampling)

    def sample(self, logits: torch.Tensor, seqs: Sequence) -> list[int]:
        greedy = self.sampler.greedy
        return self.sampler(logits, None if greedy
                            else [(s.sample_key, s.num_generated) for s in seqs])


def _most_likely(probs: torch.Tensor, logits: torch.Tensor,
                 top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk for peaked rows, a stable sort for flat ones: the same order either way."""
    vocab = probs.shape[-1]
    for k in (64, 1024):
        if k >= vocab // 4:
            break
        highest, ids = logits.topk(k, dim=-1)
        top = probs.gather(-1, ids)
        cdf = top.cumsum(dim=-1)
        kept = ((cdf - top) < top_p).sum(dim=-1, keepdim=True)
        # topk picks among tokens tied with its k-th at will: it stands where every nucleus ends
        # above the k-th logit, so no tie inside is left out.
        if bool(((cdf[:, -1] >= top_p)
                 & (highest.gather(-1, kept - 1)[:, 0] > highest[:, -1])).all()):
            return top, _ids_by_id_within_ties(highest, ids), cdf, kept
    ids = logits.sort(dim=-1, descending=True, stable=True).indices
    top = probs.gather(-1, ids)
    cdf = top.cumsum(dim=-1)
    return top, ids, cdf, ((cdf - top) < top_p).sum(dim=-1, keepdim=True)


def _ids_by_id_within_ties(top: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if not bool((top[:, 1:] == top[:, :-1]).any()):
        return ids  # no ties: two sorts spared
    ids, by_id = ids.sort(dim=-1)
    return ids.gather(-1, top.gather(-1, by_id).sort(dim=-1, descending=True, stable=True).indices)


def uniform(seed: int, request: int, position: int) -> float:
    """SplitMix64's finaliser chained over the integers: a counter-based draw, exact in float32."""
    z = _splitmix64(_splitmix64(_splitmix64(seed) ^ request) ^ position)
    return (z >> 40) / 2**24


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)
