"""A core refusal names settings by their fields; the edge writes them once as the user set them."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarathi_lab.config import ENGINE_FIELDS, SETTING, ConfigError, Keys, named_as

SETTINGS = st.sampled_from(sorted(ENGINE_FIELDS) + ["tile", "chunk_align"])
VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
RUN = Keys({"chunk_size": "chunk"}, prefix="engine.", knob_prefix="scheduler.")


def _as_run(setting: str) -> str:
    return RUN.names.get(setting) or ("engine." if setting in ENGINE_FIELDS else "scheduler.") + setting


@given(SETTINGS, VALUES, SETTINGS, st.text(alphabet=st.characters(max_codepoint=0x7e, min_codepoint=0x20)))
def test_a_refusal_is_written_by_fields_and_renamed_once_by_the_edge(setting, value, other, allowed):
    why = f" is invalid with {SETTING(other)}=1; allowed: {allowed}"
    e = ConfigError(f"{SETTING.set(setting, value)}{why}")
    assert str(e) == f"{setting}={value!r} is invalid with {other}=1; allowed: {allowed}"
    assert (e.setting, e.value, e.allowed) == (setting, repr(value), allowed)
    named = e.named(RUN)
    assert str(named) == f"{_as_run(setting)}={value!r} is invalid with {_as_run(other)}=1; allowed: {allowed}"
    assert str(named.named(Keys())) == str(named) and named.setting == setting  # named once: the first edge's


def test_a_value_the_user_set_is_shown_as_set_and_the_class_is_kept():
    from sarathi_lab.model.configs import ModelLoadError

    shown = Keys({"chunk_size": "token_budget"}, shown={"chunk_size": "auto"})
    try:
        with named_as(shown):
            raise ModelLoadError(f"{SETTING.set('chunk_size', 900)} is invalid")
    except ModelLoadError as e:
        assert str(e) == e.args[0] == "token_budget=auto is invalid"


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
