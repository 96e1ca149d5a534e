"""Each bad key refused by one check, in one line, whichever way it was set: on the command line (before
Hydra), added with +, in a sweep, or as a keyword of LLM."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.scheduler import scheduler_config
from sarathi_lab.harness import sweep_check
from sarathi_lab.harness.cli_check import check_command_line
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import parse_config

SIM = ["experiment=smoke", "logger=none", "executor=sim"]


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as refused:
        preflight(parse_config(compose_config([*SIM, *overrides])))
    return str(refused.value)


@pytest.mark.parametrize("key, value", [("chnk", "256"), ("engine.chunk_size", "8"), ("engine.blok_size", "8"),
                                        ("scheduler.nope", "3"), ("scheduler.block_size", "8")])
def test_an_unknown_key_set_or_added_meets_the_same_line(key, value):
    # Set, it is refused before Hydra starts; added with +, by the schema (or the scheduler registry).
    line = check_command_line([*SIM, f"{key}={value}"])
    assert line is not None and "\n" not in line and line.startswith(f"{key}={value} is invalid: ")
    assert _refusal([f"+{key}={value}"]) == line


def test_another_scheduler_s_knob_is_one_refusal_for_the_run_and_llm():
    line = check_command_line(["scheduler.max_num_batched_tokens=5"])
    with pytest.raises(ConfigError) as refused:
        LLM("tiny", executor="sim", max_num_batched_tokens=5)
    assert line == f"scheduler.{refused.value}"
    assert line.endswith("allowed: scheduler=vllm with it, or scheduler=sarathi's knobs: chunk_align, tile")


def test_a_bad_chunk_is_checked_by_the_engine_config_alone():
    assert _refusal(["chunk=0"]) == "chunk=0 is invalid: must be > 0"
    run = parse_config(compose_config(SIM))
    # The run's config and the scheduler's hold the engine's settings, which EngineConfig checked.
    assert dataclasses.replace(run, chunk=0).chunk == 0
    assert scheduler_config("sarathi", {}, max_batch_size=1, max_model_len=8, chunk_size=0).chunk_size == 0
    with pytest.raises(ConfigError, match=r"^tile=0 is invalid: must be > 0$"):  # its own knobs it checks
        scheduler_config("sarathi", {"tile": 0}, max_batch_size=1, max_model_len=8, chunk_size=8)


def test_a_sweep_job_is_parsed_once_for_all_its_checks(monkeypatch):
    parsed = []

    def parse(job):
        parsed.append(job)
        if job.chunk == 0:
            raise ConfigError("chunk", 0, "is invalid: must be > 0")
        return job.chunk

    class Loader:  # one Hydra invocation's
        def load_sweep_config(self, config, overrides):
            return OmegaConf.create({"hydra": {}, "chunk": int(overrides[0].partition("=")[2])})

    monkeypatch.setattr("sarathi_lab.harness.schema.parse_config", parse)
    loader = Loader()
    for _ in range(3):  # the callback's collapse, its preflight, the sweeper's collapse
        assert sweep_check._job_config(loader, None, ["chunk=8"]) == 8
        with pytest.raises(ConfigError, match="chunk=0"):
            sweep_check._job_config(loader, None, ["chunk=0"])
    assert len(parsed) == 2
    sweep_check._job_config(Loader(), None, ["chunk=8"])  # another invocation parses afresh
    assert len(parsed) == 3
