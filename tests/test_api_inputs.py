"""What LLM.generate accepts: any sequence of integer token ids, and nothing else, with a message
that names the argument and what was given; whatever happens inside, the engine stays usable."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sarathi_lab import LLM, SamplingParams
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import scheduler_class, scheduler_names
from sarathi_lab.engine.sequence import Sequence


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, max_model_len=64)


@pytest.mark.parametrize("prompts, new, message", [
    ([[]], 4, r"prompts\[0\] is empty"),
    ([[1, 99999]], 4, r"prompts\[0\] holds token 99999, outside the vocabulary"),
    ([[1], [1, -1]], 4, r"prompts\[1\] holds token -1, outside"),
    ([[1] * 60], 10, r"^prompts\[0\] \(60 tokens\) with max_new_tokens=10 has 70 tokens, more than max_model_len=64$"),
    ([[1]], 0, "max_new_tokens=0 is invalid"),
    ([[1], [2]], [3], "max_new_tokens has 1 values for 2 prompts"),
])
def test_bad_request_is_refused(llm, prompts, new, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, max_new_tokens=new)


@pytest.mark.parametrize("prompts, message", [
    ([[True, 2]], r"prompts\[0\] holds True \(bool\)"),
    ([[1.0, 2]], r"prompts\[0\] holds 1.0 \(float\)"),
    (["hello"], r"prompts\[0\] must be a sequence of token ids; got str"),
    ([1, 2, 3], "one flat sequence of ints"),
    ("hello", "got str"),
    (7, "got int"),
    ([np.array([1.5, 2.0])], "token ids must be integers; got a ndarray of float64"),
    ([torch.tensor([True, False])], "token ids must be integers; got a Tensor of torch.bool"),
])
def test_non_integer_prompts_are_a_type_error(llm, prompts, message):
    with pytest.raises(TypeError, match=message):
        llm.generate(prompts, max_new_tokens=2)


def test_request_larger_than_whole_cache_is_refused():
    llm = LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, num_kv_blocks=2, block_size=16)
    with pytest.raises(ValueError, match=r"needs 33 tokens of KV cache, more than all 32 tokens it holds$"):
        llm.generate([[1] * 30], max_new_tokens=4)  # 33 tokens, 32 of them cached
    # The last token is sampled and never cached: 30 + 3 tokens fit 32.
    assert len(llm.generate([[1] * 30], max_new_tokens=3)[0]) == 3


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_the_engine_refuses_a_request_larger_than_its_whole_cache(scheduler):
    # Through the engine directly (LLM.generate checks first): sarathi_serve had preempted and
    # rescheduled such a request forever. orca and static reserve max_model_len tokens for each
    # request, which the cache must hold, so there the request is longer than max_model_len.
    reserves = scheduler_class(scheduler).reserves_max_model_len
    engine = LLM("tiny", scheduler=scheduler, executor="sim", sim_device="a100", num_kv_blocks=5, block_size=4,
                 max_model_len=20 if reserves else None).engine
    refusal = (r"^request 0 has 22 tokens, more than max_model_len=20$" if reserves else
               r"^request 0 needs 21 tokens of KV cache, more than all 20 tokens it holds$")
    with pytest.raises(ValueError, match=refusal):
        engine.run([Sequence(0, [1] * 20, 2)], Metrics(), SamplingParams())
    assert not engine.scheduler.has_work()
    # The largest that fits: 20 cached tokens and a last one never cached; 20 tokens under orca and static.
    engine.run([Sequence(1, [1] * (19 if reserves else 20), 1)], Metrics(), SamplingParams())


def test_any_integer_sequence_is_a_prompt(llm):
    prompts = [[5, 9, 11, 3], [7, 7, 2]]
    expected = llm.generate(prompts, max_new_tokens=3)
    forms = [
        [tuple(p) for p in prompts],
        [np.array(p, dtype=np.int32) for p in prompts],
        [torch.tensor(p) for p in prompts],
        [[np.int64(t) for t in p] for p in prompts],
    ]
    for form in forms:
        assert llm.generate(form, max_new_tokens=np.int64(3)) == expected
    assert llm.generate(torch.tensor([[5, 9, 11, 3]]), max_new_tokens=[3]) == expected[:1]


@pytest.mark.parametrize("arrivals, message", [
    ([float("nan"), 0.0], r"arrival_times\[0\]=nan is invalid: must be in \[0, 86400\] s"),
    ([0.0, float("inf")], r"arrival_times\[1\]=inf is invalid"),
    ([0.0, -1.0], r"arrival_times\[1\]=-1.0 is invalid"),
])
def test_bad_arrival_times_are_refused_not_a_hang(llm, arrivals, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([[1, 2], [3]], max_new_tokens=2, arrival_times=arrivals)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": float("nan")}, "temperature=nan is invalid"),
    ({"temperature": float("inf")}, "temperature=inf is invalid"),
    ({"top_p": float("nan")}, "top_p=nan is invalid"),
    ({"seed": -1}, "seed=-1 is invalid"),
    ({"seed": 2**64}, "seed=18446744073709551616 is invalid"),
])
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("scheduler", ["static", "vllm", "orca", "sarathi", "sarathi_serve"])
def test_interrupted_generate_leaves_the_engine_reusable(scheduler):
    llm = LLM("tiny", scheduler=scheduler, chunk_size=8, max_batch_size=2, device="cpu", dtype="float32",
              warmup_iters=0)
    prompts = [[1] * 20, [2] * 9, [3] * 14]
    expected = llm.generate(prompts, max_new_tokens=5)

    def stop(record):
        if record.iteration == 3:
            raise KeyboardInterrupt  # what Ctrl-C in a notebook raises inside the loop

    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, max_new_tokens=5, on_iteration=stop)
    assert llm.block_manager.num_free == llm.num_kv_blocks
    assert not llm.engine.scheduler.has_work()
    assert llm.generate(prompts, max_new_tokens=5) == expected


@pytest.mark.parametrize("watermark", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("scheduler", ["static", "vllm", "orca", "sarathi", "sarathi_serve"])
def test_the_default_cache_admits_max_batch_size_full_length_requests_beside_the_watermark(scheduler, watermark):
    # The paper's preallocation (batch_size requests of max_model_len) with the watermark on top:
    # all four are admitted together, whichever way the scheduler takes its blocks.
    llm = LLM("tiny", scheduler=scheduler, chunk_size=64, max_batch_size=4, max_model_len=64, kv_watermark=watermark,
              device="cpu", dtype="float32", warmup_iters=0)
    llm.generate([[1] * 60] * 4, max_new_tokens=4)
    assert max(i.num_prefill_requests + i.num_decode_requests for i in llm.metrics.iterations) == 4
    assert llm.block_manager.watermark_blocks == int(watermark * llm.num_kv_blocks)
    assert llm.num_kv_blocks - llm.block_manager.watermark_blocks == 4 * 4  # 64 tokens in blocks of 16


def test_the_warm_up_request_fits_beside_the_watermark():
    # 100 blocks of 2 tokens, 1 kept free: the warm-up request had been sized to all 200 tokens,
    # which the engine refused to admit.
    llm = LLM("tiny", num_kv_blocks=100, block_size=2, device="cpu", dtype="float32")
    assert llm.block_manager.watermark_blocks == 1
    assert llm.generate([[1] * 190], max_new_tokens=4)
