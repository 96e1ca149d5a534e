"""A core refusal names settings by their fields; the edge writes them once as the user set them."""
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.config import AS_WRITTEN, ENGINE_FIELDS, ConfigError, Key, Keys, named_as

SETTINGS = st.sampled_from(sorted(ENGINE_FIELDS) + ["tile", "chunk_align"])
VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
RUN = Keys({"chunk_size": "chunk"}, prefix="engine.", knob_prefix="scheduler.")


def _as_run(setting: str) -> str:
    return RUN.names.get(setting) or ("engine." if setting in ENGINE_FIELDS else "scheduler.") + setting


@given(SETTINGS, VALUES, SETTINGS, st.text(alphabet=st.characters(max_codepoint=0x7e, min_codepoint=0x20)))
def test_a_refusal_is_written_by_fields_and_renamed_once_by_the_edge(setting, value, other, allowed):
    e = ConfigError(setting, value, "is invalid with " + Key(other) + "=1", allowed)
    assert str(e) == f"{setting}={value!r} is invalid with {other}=1; allowed: {allowed}"
    assert (e.setting, e.value, e.allowed, e.key) == (setting, value, allowed, setting)
    named = e.named(RUN)
    assert str(named) == f"{_as_run(setting)}={value!r} is invalid with {_as_run(other)}=1; allowed: {allowed}"
    assert named.named(Keys()) is named  # named once: the first edge's
    assert (named.setting, named.key) == (setting, _as_run(setting))
    assert str(pickle.loads(pickle.dumps(named))) == str(named)  # a rank's refusal, in the launcher


def test_a_key_the_edge_wrote_itself_is_never_renamed():
    e = ConfigError("workload.path", "x.csv", "is invalid: the trace has no rows", keys=AS_WRITTEN)
    with pytest.raises(ConfigError) as raised, named_as(RUN):
        raise e
    assert str(raised.value) == "workload.path='x.csv' is invalid: the trace has no rows"


def test_a_setting_joins_the_text_by_plus_only_so_that_no_f_string_drops_the_edges_name():
    with pytest.raises(TypeError):
        f"{Key('chunk_size')}"
    assert str("a " + Key("chunk_size", 8) + " b") == "a chunk_size=8 b"


def test_a_value_the_user_set_is_shown_as_set_and_the_class_is_kept():
    from sarathi_lab.model.configs import ModelLoadError

    shown = Keys({"chunk_size": "token_budget"}, shown={"chunk_size": "auto"})
    try:
        with named_as(shown):
            raise ModelLoadError("chunk_size", 900, "is invalid")
    except ModelLoadError as e:
        assert str(e) == "token_budget=auto is invalid" and e.setting == "chunk_size"


def test_the_simulators_split_is_refused_naming_its_own_setting_still_marked_for_the_edge():
    from sarathi_lab.model.presets import SPECS
    from sarathi_lab.sim.sharding import shard

    with pytest.raises(ConfigError) as e:
        shard(SPECS["mistral-7b"], 3, 1, "mistral-7b")
    assert str(e.value).startswith("sim_tp=3 is invalid for model='mistral-7b': its 32 attention heads")
    assert e.value.setting == "sim_tp"
    with pytest.raises(ConfigError) as e, named_as(RUN):
        shard(SPECS["tiny"], 1, 5, "tiny")
    assert str(e.value).startswith("engine.sim_pp=5 is invalid for engine.model='tiny': it has 4 layers")
    assert e.value.setting == "sim_pp"
