"""A core refusal names settings by their fields; the edge writes them once as the user set them."""
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
