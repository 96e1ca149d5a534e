"""The paper's setups (conf/setup/): each sets a length, the largest batch the paper's A6000 held at it,
P:D = C / (B - 1) and a KV cache holding the batch, all together, as the simulated experiments sweep
them; what-if setups say they are beyond the card."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from sarathi_lab.analysis import paper
from sarathi_lab.analysis.paper_results import pd_ratio
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.block_manager import blocks_beside_watermark, blocks_for
from sarathi_lab.harness import CONF_DIR
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.model import PRESETS
from sarathi_lab.sim import load_device, max_batch
from tests.kv_plans import sim_blocks

SETUPS = sorted(p.stem for p in (CONF_DIR / "setup").glob("*.yaml"))
PAPER = [s for s in SETUPS if not s.endswith("_what_if")]
WHAT_IF = [s for s in SETUPS if s.endswith("_what_if")]
CHUNK = 256  # the paper's chunk at its setups (Fig. 11a)


def _run(setup: str, *more: str):
    return parse_config(compose_config(["experiment=sim/orca_compare", f"setup={setup}", *more]))


def test_the_paper_s_setups_are_its_three_lengths():
    assert [_run(s).seq_len for s in PAPER] == sorted(paper.LARGEST_BATCH)
    assert WHAT_IF  # the batch of 1K where it does not fit


@pytest.mark.parametrize("setup", SETUPS)
def test_a_setup_sets_the_batch_its_p_d_and_a_cache_holding_the_batch(setup):
    run = _run(setup)
    length, size = run.seq_len, run.batch_size
    if setup in PAPER:
        assert size == paper.LARGEST_BATCH[length]
    else:
        assert size > paper.LARGEST_BATCH[length]
    assert run.pd_ratio == round(pd_ratio.optimal_pd_ratio(CHUNK, size))
    assert run.workload.num_requests == 3 * size   # three baseline batches
    engine = run.engine
    assert engine.num_kv_blocks == blocks_beside_watermark(size * blocks_for(length, engine.block_size),
                                                           engine.kv_watermark)


@pytest.mark.parametrize("setup", SETUPS)
def test_only_a_what_if_setup_needs_a_kv_cache_beyond_the_card(setup):
    engine = _run(setup).engine
    asks = OmegaConf.load(CONF_DIR / "setup" / f"{setup}.yaml").engine.get("sim_kv_beyond_device", False)
    assert asks == (setup in WHAT_IF)
    config = PRESETS["llama-13b"]
    assert sim_blocks(engine, config) == engine.num_kv_blocks
    if setup in WHAT_IF:
        with pytest.raises(ConfigError, match="sim_kv_beyond_device=true runs it as a what-if"):
            sim_blocks(parse_config(compose_config(
                ["experiment=sim/orca_compare", f"setup={setup}",
                 "engine.sim_kv_beyond_device=false"])).engine, config)


def test_the_engine_s_memory_rule_gives_the_paper_s_batches_but_one_request_short_at_2k():
    # sim.max_batch keeps back the activations of prefilling every prompt at once: the paper's 18 and 6,
    # and 9 where the paper ran 10 (its 2K batch's KV cache still fits the card beside the weights).
    found = {length: max_batch(load_device("a6000"), PRESETS["llama-13b"], length)
             for length in paper.LARGEST_BATCH}
    assert found == paper.LARGEST_BATCH | {2048: paper.LARGEST_BATCH[2048] - 1}


def test_orca_s_best_case_staggers_each_setup_s_own_batch():
    # workload=staggered resolves its stagger per job: a sweep over setups cannot pass the batch along.
    for setup in PAPER:
        run = _run(setup, "workload=staggered")
        assert run.workload.stagger == run.batch_size and run.workload.kind == "synthetic"
    assert _run(PAPER[0], "workload=synthetic").workload.stagger == 0


@pytest.mark.parametrize("name", ["orca_compare", "chunk_batch"])
def test_the_simulated_sweeps_run_the_paper_s_setups_and_only_their_own_axes(name):
    params = compose_config([f"experiment=sim/{name}"], hydra=True).hydra.sweeper.params
    swept = str(params["setup"]).split(",")
    assert swept[:len(PAPER)] == PAPER and set(swept[len(PAPER):]) <= set(WHAT_IF)
    # The experiment's own lengths, batches and P:D are dropped: the setups set them together.
    assert not {"seq_len", "batch_size", "pd_ratio"} & set(params)
    assert str(params["++scheduler.chunk_align"]).startswith("none,")
