"""The launch step's overlapped twins (measure/gpu/steps/launch.py) and their per-stream timeline
(measure/profiling/overlap.py), with the measurement faked where it needs a GPU."""
from __future__ import annotations

import json

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.analysis.launch_grid import CASES
from sarathi_lab.measure.profiling.overlap import concurrent_ms, kernel_rows, streams_busy_ms


def test_kernel_rows_keep_each_kernels_stream_from_the_trace():
    events = [{"cat": "kernel", "name": "gemm", "ts": 110.0, "dur": 50.0, "args": {"stream": 7}},
              {"cat": "cpu_op", "name": "aten::mm", "ts": 90.0, "dur": 80.0},
              {"cat": "kernel", "name": "_paged_attention_kernel", "ts": 100.0, "dur": 30.0,
               "args": {"stream": 21}}]
    rows = kernel_rows(events)
    assert [(r["stream"], r["start_us"], r["dur_us"]) for r in rows] == [(21, 0.0, 30.0), (7, 10.0, 50.0)]
    assert concurrent_ms(rows) == 0.02  # 110-130 us: both streams
    assert streams_busy_ms(rows) == {21: 0.03, 7: 0.05}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(1, 20)), max_size=12))
def test_concurrent_time_is_the_time_two_streams_are_busy(spans):
    # One stream's kernels never overlap: lay each stream's out back to back from its start.
    rows, ends = [], {}
    for stream, gap, dur in spans:
        start = ends.get(stream, 0) + gap
        rows.append({"stream": stream, "start_us": start, "dur_us": dur})
        ends[stream] = start + dur
    # The reference: per microsecond tick, whether two streams run a kernel then.
    horizon = max(ends.values(), default=0)
    both = sum(len({r["stream"] for r in rows if r["start_us"] <= t < r["start_us"] + r["dur_us"]}) >= 2
               for t in range(horizon))
    assert abs(concurrent_ms(rows) - both / 1e3) < 1e-9


def test_the_overlapped_twins_are_named_and_judged_beside_the_engine_rows(monkeypatch, tmp_path):
    from sarathi_lab import LLM
    from sarathi_lab.measure.gpu.steps import launch as launch_overlap

    seen = []

    def fake(llm, chunk, decodes, context, reps):
        seen.append((chunk, decodes, context))
        timeline = [{"source": "graph", "stream": s, "name": "k", "start_us": 5.0 * s, "dur_us": 10.0}
                    for s in (1, 2)]
        return ({"whole_ms": 30.0, "overlap_ms": 27.0, "cut": 256, "rel_diff": 0.001,
                 "tokens_equal": True}, timeline)

    monkeypatch.setattr("sarathi_lab.measure.profiling.overlap.measure_overlap", fake)
    llm = LLM("tiny", device="cpu", dtype="float32", max_batch_size=2, max_model_len=32)
    env = {"copy_gbps": 100.0, "matmul_tflops": 10.0}
    metrics, note = launch_overlap.overlapped(llm, CASES, (512, 1024), 1, env, True, tmp_path)
    assert seen == [(512, 17, 512), (495, 17, 512), (512, 17, 1024), (495, 17, 1024)]
    by_name = {m.metric: m for m in metrics}
    for key in ("c=512+b=17", "c=495+b=17,ctx=1024"):
        assert by_name[f"overlap_gain_ms[{key}]"].value == -3.0 and by_name[f"overlap_gain_ms[{key}]"].holds
        over, whole = by_name[f"engine_over_floor[{key},overlap]"], by_name[f"engine_over_floor[{key},whole]"]
        assert over.target == "<= 1.3" and over.value < whole.value
        assert by_name[f"overlap_streams[{key},graph]"].value == 2
        assert by_name[f"overlap_concurrent_ms[{key},graph]"].value == 0.005
    timeline = pd.read_csv(tmp_path / launch_overlap.TIMELINE)
    assert list(timeline.columns) == launch_overlap.COLUMNS and len(timeline) == 8
    assert "c=512+b=17, c=495+b=17 at contexts 512, 1024" in note
    entry = json.loads((tmp_path / launch_overlap.ENTRY).read_text())  # what the tune step installs
    assert entry == {"enabled": True, "min_tokens": 512}
