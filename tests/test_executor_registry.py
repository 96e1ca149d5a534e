"""The executor registry: each executor's capabilities refuse, in one line before any work, every
setting it cannot honour (naming the full key, the value and what is allowed), and nothing outside
the registry compares an executor's name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sarathi_lab.config import ENGINE_DEFAULTS, ConfigError, EngineConfig, named_as
from sarathi_lab.executors import (
    CAPABILITIES,
    ExecutorKind,
    _takes,
    executor_class,
    executor_names,
    recorded_as,
    recorded_label,
    task_refusal,
)
from sarathi_lab.harness.schema import RUN_KEYS
from sarathi_lab.harness.vllm_args import CHUNKED_PREFILL

PACKAGE = Path(__file__).resolve().parents[1] / "sarathi_lab"
# A value of each setting some executor cannot honour.
ASKED = {"tensor_parallel": 2, "pipeline_parallel": 2, "sim_tp": 2, "sim_pp": 2, "cuda_graphs_mixed": False,
         "kv_watermark": 0.1, "scheduler": "orca", "attention": "torch", "attention_hybrid": "pod",
         "cpu_linear": "aten", "overlap": "nano_batch"}
# Settings an engine plan is made with here whatever the executor (a model that fits, vLLM's scheduler).
BASE = {"model": "tiny", "device": "cpu", "dtype": "float32", "num_kv_blocks": 40, "sim_device": "a100"}


def test_every_capability_has_a_value_tried():
    assert {cap.setting for cap in CAPABILITIES} == set(ASKED)


@pytest.mark.parametrize("executor", executor_names())
@pytest.mark.parametrize("setting", sorted(ASKED))
def test_a_setting_the_executor_cannot_honour_is_refused_in_one_line_naming_the_full_key(executor, setting):
    cap = next(c for c in CAPABILITIES if c.setting == setting)
    value = ASKED[setting]
    settings = BASE | {"executor": executor, setting: value}
    if executor == "vllm" and setting != "scheduler":
        settings["scheduler"] = "sarathi_serve"
    if _takes(getattr(executor_class(executor), cap.attribute), value, ENGINE_DEFAULTS[setting]):
        return  # honoured: whatever else refuses it (cores, the attention backend) is not this table's
    with pytest.raises(ConfigError) as e, named_as(RUN_KEYS):  # the run's edge names the keys
        EngineConfig(**settings)
    line = str(e.value)
    key = RUN_KEYS(setting)
    assert line.startswith(f"{key}={value!r} is invalid with engine.executor={executor!r}: "), line
    assert "\n" not in line and "; allowed: " in line


def test_what_each_executor_honours():
    model, sim, vllm = (executor_class(n) for n in ("model", "sim", "vllm"))
    assert model.tensor_parallel and model.pipeline_parallel and not sim.tensor_parallel and not vllm.tensor_parallel
    assert sim.simulated and not model.simulated and not vllm.simulated
    assert vllm.batches is None and model.batches and sim.batches  # vLLM's engine runs its own
    # vLLM's engine runs the two of our schedulers that are its own, and no other.
    assert set(vllm.schedulers) == set(CHUNKED_PREFILL)


def test_a_task_the_executor_cannot_run_is_refused_and_the_others_pass():
    assert str(task_refusal("sim", "profile")).startswith("task=profile is invalid with executor=sim: ")
    assert str(task_refusal("vllm", "op_breakdown")).endswith("allowed: executor=model, sim, or task=serve, capacity")
    assert all(task_refusal(n, t) is None for n in executor_names() for t in ("serve", "capacity"))
    assert task_refusal("model", "profile") is None and task_refusal("sim", "reread") is None


def test_llm_refuses_an_executor_it_does_not_drive_and_sampling_a_simulator_cannot_do():
    from sarathi_lab import LLM, SamplingParams

    with pytest.raises(ConfigError, match=r"^executor='vllm' is invalid for LLM: .*allowed: model, sim$"):
        LLM("tiny", executor="vllm", scheduler="sarathi_serve", device="cpu")
    llm = LLM("tiny", executor="sim", sim_device="a100", max_batch_size=2, chunk_size=32)
    with pytest.raises(ConfigError, match=r"^sampling.temperature=0.5 is invalid with executor='sim'"):
        llm.generate([[1, 2, 3]], 2, sampling=SamplingParams(temperature=0.5))
    assert len(llm.generate([[1, 2, 3]], 2)[0]) == 2


def test_no_executor_name_is_compared_outside_the_registry():
    """Neither on a run's config nor on a recorded run's (whose executor is read by recorded_as)."""
    compared = re.compile(r'executor("\]|"\)|\b)\)?\s*(==|!=)\s*"(sim|vllm|model)"|executor != "model"')
    sites = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py") if path.name != "executors.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert sites == []


def test_a_recorded_executor_reads_by_its_capabilities_and_an_unknown_one_has_none():
    assert recorded_as("sim", "simulated") and not recorded_as("model", "simulated")
    assert not recorded_as(None, "simulated") and not recorded_as(float("nan"), "simulated")
    assert not recorded_as(["sim"], "simulated")  # a damaged record: no capability, no crash
    assert recorded_as("vllm", "engine_label") and not recorded_as("nonesuch", "runs_model")
    assert recorded_label("vllm") == "vLLM" and recorded_label("model") is None
    assert recorded_label(None) is None and recorded_label("nonesuch") is None


def test_the_record_states_the_layout_that_ran(monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 4)
    split = EngineConfig(device="cpu", tensor_parallel=2, pipeline_parallel=2)
    split = split.kind.record(split, "cpu")
    assert (split["tensor_parallel"], split["pipeline_parallel"]) == (2, 2)
    whole = EngineConfig(executor="vllm", scheduler="sarathi_serve", device="cpu")
    whole = whole.kind.record(whole, "cpu")
    assert "tensor_parallel" not in whole and "pipeline_parallel" not in whole  # one device: vLLM splits nothing


# A kind's attributes (what it is, honours, names), not its methods: outside the registry a kind is asked
# (kind.warm_up(llm), kind.prepare(plan), kind.check_settings(cfg), kind.timing_caveat(llm)...), and of
# what it is only what it describes is read, passed on as it is, never branched on.
ATTRIBUTES = sorted(a for a in {*vars(ExecutorKind), *ExecutorKind.__annotations__}
                    if not a.startswith("_") and not callable(getattr(ExecutorKind, a, None)))
FLAG = re.compile(r"(kind|executor_class\([^)]*\))\.(" + "|".join(ATTRIBUTES) + r")\b")
DESCRIBED = {  # attribute: where it is passed on as it is
    "noun": {"harness/cli_check.py": 1},          # a message's words for it
    "tags": {"harness/run_recorder.py": 1},       # its runs' W&B tags
    "load_record": {"harness/run_recorder.py": 1},  # what its records say of the machine's load
    "gc_gen0_threshold": {"run.py": 1},           # the collector's threshold its runs run under
}
RECORD_READS = {  # recorded_as/_label: a recorded run's executor labels its numbers (predicted, measured, whose)
    "harness/results.py": 2, "harness/sweep.py": 1, "analysis/capacity.py": 1, "analysis/capacity_docs.py": 3,
    "analysis/claims.py": 1, "analysis/publish.py": 1, "analysis/runs.py": 3,
    "analysis/paper_results/decode_speedup.py": 1, "analysis/paper_results/pd_ratio.py": 1,
    "measure/sim_check/sim_vs_gpu.py": 1,
}


def _sites(pattern: re.Pattern) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "executors.py" and (n := len(pattern.findall(path.read_text()))):
            found[path.relative_to(PACKAGE).as_posix()] = n
    return found


def _attribute_reads() -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "executors.py":
            for _, attribute in FLAG.findall(path.read_text()):
                sites = found.setdefault(attribute, {})
                where = path.relative_to(PACKAGE).as_posix()
                sites[where] = sites.get(where, 0) + 1
    return found


def test_callers_ask_the_kind_and_read_only_what_it_describes():
    """Built, planned, checked, warmed up and recorded by the kind (executors.build, kind.plan,
    kind.warm_up, kind.record...), not by branches on what it is: no flag, capability or step of a kind
    is read outside the registry, and a described value only where listed."""
    assert _attribute_reads() == DESCRIBED
    assert _sites(re.compile(r"recorded_(as|label)\(")) == RECORD_READS


@pytest.mark.parametrize("line", ["if kind.runs_model:", "cfg.engine.kind.simulated and x",
                                  "executor_class(name).engine_label", "if self.kind.warmer is None:"])
def test_a_flag_read_outside_the_registry_is_seen(line):
    assert FLAG.search(line) and FLAG.search(line).group(2) not in DESCRIBED


def test_every_kind_names_callables_that_exist():
    import importlib

    for name in executor_names():
        kind = executor_class(name)
        for target in (getattr(kind, a) for a in ATTRIBUTES):  # "module:callable": a step it takes
            if isinstance(target, str) and ":" in target:
                module, _, attributes = target.partition(":")
                found = importlib.import_module(module)
                for attribute in attributes.split("."):
                    found = getattr(found, attribute)
                assert callable(found), (name, target)


def test_the_registry_builds_each_of_our_kinds_and_plans_each_as_it_names():
    from sarathi_lab import LLM
    from sarathi_lab.engine.clock import VirtualClock
    from sarathi_lab.executors import build
    from sarathi_lab.plan import plan_engine

    sim = build(plan_engine(EngineConfig(executor="sim", sim_device="a100", max_batch_size=2, chunk_size=32)))
    assert isinstance(sim, LLM) and isinstance(sim.engine.clock, VirtualClock) and sim.plan.device is None
    assert sim.setup["parts"] == {} and sim.setup["warmup"] is None
    small = {"device": "cpu", "max_batch_size": 2, "chunk_size": 32, "warmup_iters": 0}
    model = build(plan_engine(EngineConfig(**small)))
    assert isinstance(model, LLM) and model.plan.device.type == "cpu" and model.setup["parts"]["model"] == "built"
    assert model.generate([[1, 2, 3]], 2) == LLM(**small).generate([[1, 2, 3]], 2)


def test_the_steps_of_our_model_are_its_own_and_the_other_kinds_take_none(monkeypatch):
    """What LLM, the runner, the recorder and a sweep's estimate ask each kind, stood in for."""
    from types import SimpleNamespace as Stub

    import torch
    from sarathi_kernels import cpu_build

    from sarathi_lab.model.shared_engine import SHARED

    released = []
    monkeypatch.setattr(SHARED, "release", lambda: released.append(True))
    for name in ("sim", "vllm"):
        kind = executor_class(name)
        assert kind.prepare(None) is None and kind.shared_parts(None) is None and kind.warm_up(None) is None
        assert kind.parts(None) == {} and kind.timing_caveat(None) is None and not kind.simulator_times("cpu")
    # vLLM sizes its cache by the device's free memory: a kept model of an earlier job is freed.
    assert released == [True]
    model = executor_class("model")
    loaded = []
    monkeypatch.setattr(cpu_build, "library", loaded.append)
    for device in ("cpu", "cuda"):
        model.prepare(Stub(host=Stub(device_type=device)))
    assert loaded == [cpu_build.KERNELS, cpu_build.PLANNER]  # a GPU run plans its attention on the host
    assert model.simulator_times("cpu") and not model.simulator_times("cuda")

    def llm(attention):
        return Stub(config=Stub(attention=attention), device=torch.device("cpu"))

    assert "Triton's interpreter" in model.timing_caveat(llm("triton"))
    assert model.timing_caveat(llm("torch")) is None
