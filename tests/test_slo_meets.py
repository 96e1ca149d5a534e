"""RequestRecord.meets, which skips the P99 of a request's gaps when its largest gap is within the
target, against the definition written out: every target set is met (NaN where a one-token request
has no TPOT or TBT), the TBT one by numpy's P99 of the gaps."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.engine.metrics import SLO, RequestRecord

gaps = st.lists(st.floats(0.0, 0.2, allow_nan=False), min_size=0, max_size=40)
limit = st.none() | st.floats(0.0, 0.25, allow_nan=False)


def _defined(r: RequestRecord, slo: SLO) -> bool:
    p99 = float(np.percentile(np.diff(r.token_times), 99)) if r.output_len > 1 else math.nan
    checks = [(slo.ttft_s, r.ttft), (slo.tpot_s, r.tpot), (slo.e2e_s, r.e2e), (slo.tbt_p99_s, p99)]
    return all(lim is None or math.isnan(v) or v <= lim for lim, v in checks)


@given(first=st.floats(0.0, 2.0), steps=gaps, ttft=limit, tpot=limit, e2e=st.none() | st.floats(0.0, 10.0),
       tbt=limit)
def test_meets_is_the_definition(first, steps, ttft, tpot, e2e, tbt):
    times = list(np.cumsum([first, *steps]))
    r = RequestRecord(0, prompt_len=4, arrival=0.0, output_len=len(times), first_scheduled=0.0,
                      first_token=times[0], finish=times[-1], token_times=times)
    slo = SLO(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, tbt_p99_s=tbt)
    assert r.meets(slo) == _defined(r, slo)
