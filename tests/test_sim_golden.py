"""The simulator's results on fixed traces, held to values it produced before its speed-ups: a change
made for speed alone (imports, the loop's hot spots, how cost models are found) must leave every
record of these runs as it was. The digest covers each iteration's and request's record and the
summary (measure/sim_check/sim_speed.py's digest)."""
from __future__ import annotations

import warnings

import pytest

from sarathi_lab import LLM
from sarathi_lab.measure.sim_check.sim_speed import digest, workload

# One case per scheduler, over the three cost models, tensor parallelism and three devices: the LLM's
# settings, and (digest, iterations, makespan_s) of 40 requests of 100-900 prompt and 4-64 decode
# tokens at 6 req/s.
CASES = {
    "sarathi_serve_roofline_a100": ({"sim_device": "a100", "scheduler": "sarathi_serve", "chunk_size": 512,
                                     "max_batch_size": 16},
                                    ("617fb8b95fb0bb4c", 536, 6.600693445525754)),
    "sarathi_calibrated_h100": ({"sim_device": "h100", "sim_cost_model": "calibrated", "scheduler": "sarathi",
                                 "chunk_size": 256, "max_batch_size": 8},
                                # The H100 calibration fitted to its GPU lease (calibration.fit_lease), with
                                # tile-aligned chunks (the default); chunk_align="none" gives
                                # ("b6fe49e650d321b5", 666, 6.4434430568747585).
                                ("8c789ba38e3d84d3", 667, 6.443397388893468)),
    "vllm_profile_a100": ({"sim_device": "a100", "sim_cost_model": "profile", "scheduler": "vllm",
                           "max_batch_size": 8},
                          ("8d04aa9270b20c01", 443, 6.762290011314876)),
    "orca_roofline_tp2_a100": ({"sim_device": "a100", "sim_tp": 2, "scheduler": "orca", "max_batch_size": 8},
                               ("c34fd674218f9a98", 842, 6.506548852379615)),
    "static_roofline_a40": ({"sim_device": "a40", "scheduler": "static", "max_batch_size": 4},
                            ("dd124e1409eba946", 908, 24.83744797460855)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_trace_records_are_unchanged(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profile case names what its kernels lack
        llm = LLM("llama2-7b", executor="sim", num_kv_blocks=600, **CASES[case][0])
    prompts, decodes, arrivals = workload(40, (100, 900), (4, 64), rate_rps=6.0)
    llm.generate(prompts, decodes, arrival_times=arrivals)
    summary = llm.metrics.summary()
    assert (digest(llm.metrics), summary["num_iterations"], summary["makespan_s"]) == CASES[case][1]
