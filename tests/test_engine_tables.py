"""The engine's tables, built as arrow tables without pandas (harness/run_recorder.py), are the files a
DataFrame of the same records was written as: the same schema and, read back, the same frames, for a
finished run with preemptions, a run stopped halfway (times still None, unfinished requests) and none."""
from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sarathi_lab import LLM, Metrics
from sarathi_lab.harness.run_recorder import engine_tables
from sarathi_lab.measure.sim_check.sim_speed import workload


class _Stop(Exception):
    pass


def _metrics(stop_after: int | None) -> Metrics:
    # A cache of 40 blocks of 16 tokens under 12 requests of up to 400 tokens: preemptions.
    llm = LLM("llama2-7b", executor="sim", sim_device="a100", scheduler="sarathi_serve", chunk_size=128,
              max_batch_size=8, num_kv_blocks=40)
    prompts, decodes, arrivals = workload(12, (50, 300), (1, 100), rate_rps=50.0)

    def stop(record):
        if stop_after is not None and record.iteration >= stop_after:
            raise _Stop

    try:
        llm.generate(prompts, decodes, arrival_times=arrivals, on_iteration=stop)
    except _Stop:
        pass
    return llm.metrics


@pytest.mark.parametrize("stop_after", [None, 3, 0])
def test_engine_tables_are_the_files_a_dataframe_writes(tmp_path, stop_after):
    metrics = _metrics(stop_after)
    if stop_after is None:
        assert sum(r.num_preemptions for r in metrics.requests) > 0  # the case that fills preempted ids
    expected = {"iterations": pd.DataFrame(metrics.iteration_columns()),
                "requests": pd.DataFrame(metrics.request_rows())}
    for name, table in engine_tables(metrics).items():
        pq.write_table(table, tmp_path / f"{name}.arrow.parquet")
        expected[name].to_parquet(tmp_path / f"{name}.pandas.parquet", index=False)
        ours, theirs = (pq.read_schema(tmp_path / f"{name}.{how}.parquet") for how in ("arrow", "pandas"))
        assert ours.remove_metadata() == theirs.remove_metadata()
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.arrow.parquet"),
                                      pd.read_parquet(tmp_path / f"{name}.pandas.parquet"))


def test_no_records_are_empty_tables():
    tables = engine_tables(Metrics())
    assert [(t.num_columns, t.num_rows) for t in tables.values()] == [(0, 0), (0, 0)]
