"""Co-scheduled attention pays only for what it wins: its plan is made once per batch length signature
(a replay of a shape met before does no per-item placement) and stays equal to attention/reference.py
when reused for another batch of that signature; the engine co-schedules a batch only where the
device's tuned table measured it faster at the nearest shape, and never where the table says nothing."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from sarathi_kernels import pod_plan
from sarathi_kernels.pod_attention import PodWork, pod_tiles

from sarathi_lab.attention.co_schedule import NEVER, CoScheduleRule, entries_from_rows
from sarathi_lab.tuned_kernels import DEFAULT, using
from tests.test_kernels import assert_close, expected, make_inputs
from tests.test_pod_attention import always, run_pod

LEASE = Path(__file__).resolve().parents[1] / "docs/gpu/h100/2026-11-27_7fae342"
LEASE_HYBRID = LEASE / "steps/hybrid/hybrid_attention.csv"


def test_a_second_build_of_a_signature_does_no_per_item_work(monkeypatch):
    tiles = pod_tiles(40, 40, 128, 2)[0]
    pod_plan._PLANS.clear()
    calls = []
    items = pod_plan.pod_items
    monkeypatch.setattr(pod_plan, "pod_items", lambda *a, **k: calls.append(1) or items(*a, **k))
    query_lens, seq_lens = [256] + [1] * 16, [1024] + [1000] * 16
    first = pod_plan.cached_plan(query_lens, seq_lens, 40, tiles, num_sms=132)
    assert calls == [1] and first == pod_plan.plan_pod(query_lens, seq_lens, 40, tiles, num_sms=132)
    calls.clear()
    # The next iteration: every decode one token longer, inside the same signature's key tiles.
    again = pod_plan.cached_plan(query_lens, [1024] + [1001] * 16, 40, tiles, num_sms=132)
    assert again is first and not calls
    # A decode crossing into another group of key tiles is another signature: planned anew.
    pod_plan.cached_plan(query_lens, [1024] + [1090] * 16, 40, tiles, num_sms=132)
    assert calls == [1]


def test_the_work_buffers_load_the_plan_s_own_arrays():
    tiles = pod_tiles(8, 2, 16, 4)[0]
    plan = pod_plan.plan_pod([20, 1, 1], [50, 9, 33], 2, tiles, num_sms=2)
    work = PodWork(plan.programs, len(plan.items) + 3, torch.device("cpu"))
    work.load(plan)
    assert work.work_indptr.tolist() == plan.work_indptr
    assert work.items[: len(plan.items)].tolist() == [list(item) for item in plan.items]


def test_a_plan_reused_for_another_batch_of_its_signature_is_exact():
    # The plan made for the first batch runs the second (contexts a few tokens longer, the same key
    # tiles): every item still computes its own rows over the second batch's lengths.
    pod_plan._PLANS.clear()
    for decodes in ([9, 33], [12, 40]):
        torch.manual_seed(len(pod_plan._PLANS))
        query, k_cache, v_cache, meta = make_inputs([(20, 50)], [(1, n) for n in decodes], heads=4, kv_heads=2,
                                                    head_dim=16, block_size=16, dtype=torch.float32)
        out = run_pod(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, num_sms=2,
                      block_n=16)
        assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)
    assert len(pod_plan._PLANS) == 1


def _hybrid_meta():
    query, k_cache, v_cache, meta = make_inputs([(20, 50)], [(1, 9), (1, 33)], heads=4, kv_heads=2, head_dim=16,
                                                block_size=16, dtype=torch.float32)
    return query, k_cache, v_cache, meta


def test_without_a_measured_rule_the_engine_never_co_schedules():
    from sarathi_lab.attention import make_backend
    from sarathi_lab.attention.triton_backend import PodLaunch

    query, k_cache, v_cache, meta = _hybrid_meta()
    backend = make_backend("triton", query.device, "pod")
    with using(DEFAULT):
        assert not backend.co_schedules(meta, 4, k_cache)
        out = backend.attend(query, k_cache, v_cache, meta, 16 ** -0.5)
    assert not isinstance(meta.plan, PodLaunch)
    assert_close(out, expected(query, k_cache, v_cache, meta), torch.float32)
    with using(always(2)):
        assert backend.co_schedules(meta, 4, k_cache)
        assert not make_backend("triton", query.device).co_schedules(meta, 4, k_cache), "sequential stays so"
    with using(always(1)):
        assert not backend.co_schedules(meta, 4, k_cache), "measured for another GQA group only"


def test_the_nearest_measured_shape_decides():
    rule = CoScheduleRule.from_entries(entries_from_rows(list(csv.DictReader(LEASE_HYBRID.open()))), "lease")
    # The H100 lease: 32/8 heads, c=512 beside 16 decodes at 1K ran at 0.74 of the sequential kernels;
    # c=256 beside 16 at 1K at 1.11.
    assert rule.co_schedules(4, 512, 16, 1024) and rule.co_schedules(4, 500, 17, 1100)
    assert not rule.co_schedules(4, 256, 16, 1024)
    assert not rule.co_schedules(2, 512, 16, 1024), "no measured shape of that group"
    assert not NEVER.co_schedules(4, 512, 16, 1024)


@pytest.mark.parametrize("entries,message", [
    ({"heads": 4}, r"error: t\.json: co_schedule=\{'heads': 4\} is invalid; allowed: a list"),
    ([{"heads": 4}], r"error: t\.json: co_schedule\[0\]=.* is invalid; allowed: exactly the keys heads, kv_heads"),
    ([{"heads": 4, "kv_heads": 1, "chunk": 64, "decodes": 2.5, "context": 9, "over_sequential": 0.9}],
     r"error: t\.json: co_schedule\[0\]\.decodes=2\.5 is invalid; allowed: a positive integer"),
])
def test_a_bad_entry_fails_in_one_line_naming_it(entries, message):
    with pytest.raises(ValueError, match=message):
        CoScheduleRule.from_entries(entries, "t.json")


def test_a_table_file_carries_its_entries(tmp_path):
    from sarathi_lab.tuned_kernels import load

    table = always(4)
    path = tmp_path / "GPU.json"
    path.write_text(json.dumps(table.to_json()))
    assert load(path).co_schedule == table.co_schedule
    assert "co_schedule" not in DEFAULT.to_json()
