"""The CLI as users start it: a fresh interpreter per case (`python -m sarathi_lab.run ...`), no
environment prepared by conftest. Bad input of every family is one line, exit 2, no traceback and
no metrics.json; a rerun into a finished run changes none of its bytes; --help imports no engine."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.hf_models import save_random_model

SMOKE = ["experiment=smoke", "logger=none", "workload.num_requests=2", "seq_len=48", "pd_ratio=5"]
# A clean environment: only the path to this checkout, as an installed package would have.
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON", "SARATHI", "WANDB"))}


def _run(*args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=cwd, env=ENV)


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env=ENV).stdout.strip()


def test_help_and_import_load_no_engine():
    # Time is not asserted (shared machines); what made --help take 6 s was importing torch.
    loaded = _python("import runpy, sys\nsys.argv = ['sarathi_lab.run', '--help']\n"
                     "try:\n    runpy.run_module('sarathi_lab.run', run_name='__main__')\n"
                     "except SystemExit:\n    pass\n"
                     "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'wandb') if m in sys.modules))")
    assert loaded.splitlines()[-1] == "[]"
    assert _python("import sarathi_lab, sys; print('torch' in sys.modules)") == "False"
    assert _python("from sarathi_lab import LLM, EngineConfig; "
                   "print(LLM.__name__, EngineConfig().chunk_size)") == "LLM 512"


def test_the_bf16_fallback_is_one_line_said_once_by_the_plan():
    code = ("import sarathi_lab.host_features as h\nh.cpu_has_bf16_units = lambda: False\n"
            "from sarathi_lab.config import EngineConfig\nfrom sarathi_lab.plan import plan_engine\n"
            "cfg = EngineConfig(device='cpu', max_model_len=64, num_kv_blocks=16)\n"
            "print(plan_engine(cfg).dtype, plan_engine(cfg).dtype)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, env=ENV)
    assert err.stdout.strip() == "torch.float32 torch.float32"
    assert err.stderr.strip() == "dtype='bfloat16' runs as float32: this CPU has no bf16 matrix instructions"


BARE_WORD = ("{} is invalid: an argument must be a key=value override (chunk=256; +key=value adds a key, ~key "
             "deletes one) or a flag (-m for a multirun sweep, --cfg job, --help)")


@pytest.mark.parametrize("args, line", [
    (["chunck=256"], "chunck=256 is invalid: chunck is not a known key; nearest known keys: chunk"),
    (["engine.kv_cache=1"], ("engine.kv_cache=1 is invalid: engine.kv_cache is not a known key; nearest known keys: "
                             "engine.kv_cache_gb, engine.kv_watermark, engine.num_kv_blocks")),
    (["scheduler=fcfs"], "scheduler='fcfs' is invalid: allowed values are orca, sarathi, sarathi_serve, static, vllm"),
    # Hydra's answer was a grammar error, a link and exit 1. `job` is --cfg's value, not a bare word.
    (["foo"], BARE_WORD.format("foo")),
    (["-m", "--cfg", "job", "chunk=8,16", "foo"], BARE_WORD.format("foo")),
    # Hydra's answer was six lines and exit 1.
    (["chunk=8,16"], ("chunk=8,16 is invalid without -m: a sweep runs one job per value with -m first "
                      "(-m chunk=8,16); a list is key=[a,b]")),
])
def test_an_unknown_key_or_choice_is_one_line_before_hydra_starts(tmp_path, args, line):
    proc = _run(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {line}" and not proc.stdout
    assert not (tmp_path / "run").exists()


def _model(tmp_path, **config):
    path = tmp_path / "model"
    save_random_model("llama", path)
    (path / "config.json").write_text(json.dumps(json.loads((path / "config.json").read_text()) | config))
    return path


def _bad(tmp_path, case):
    """The overrides of one bad-input case (some write the file they name)."""
    trace = tmp_path / "trace.csv"
    header = b"arrived_at,num_prefill_tokens,num_decode_tokens\n"
    if case == "trace_not_utf8":
        trace.write_bytes(header + b"0.0,5,5\xff\n")
    elif case == "trace_trillions":
        trace.write_bytes(header + b"0.0,4000000000000,5\n")
    if case.startswith("trace"):
        return ["workload=trace", f"workload.path={trace}"]
    if case == "model_json":
        path = _model(tmp_path)
        (path / "config.json").write_text("{")
    elif case == "model_empty_weights":
        path = _model(tmp_path)
        (path / "model.safetensors").write_bytes(b"")
    elif case == "model_zero_layers":
        path = _model(tmp_path, num_hidden_layers=0)
    elif case == "model_rope_table":
        path = _model(tmp_path, max_position_embeddings=10**13)
    else:
        return {"pd_ratio_nan": ["pd_ratio=nan"], "kv_inf": ["engine.kv_cache_gb=inf"],
                "kv_huge": ["engine.kv_cache_gb=100000"], "theta_nan": ["workload=zipf", "workload.theta=nan"],
                "qps_nan": ["workload.arrival=poisson", "workload.qps=nan"],
                "seed_negative": ["seed=-1"], "seed_65_bits": [f"seed={2**64}"],
                "warmup": ["engine.warmup_iters=4096"], "seq_len_huge": ["seq_len=1000000000000"],
                "float16": ["dtype=float16", "device=cpu"]}[case]
    return ["model=hf", f"model.path={path}"]


@pytest.mark.e2e
@pytest.mark.parametrize("case, key", [
    ("pd_ratio_nan", "pd_ratio=nan"), ("kv_inf", "engine.kv_cache_gb=inf"), ("kv_huge", "engine.kv_cache_gb=100000"),
    ("theta_nan", "workload.theta=nan"), ("qps_nan", "workload.qps=nan"), ("seed_negative", "seed=-1"),
    ("seed_65_bits", f"seed={2**64}"), ("warmup", "engine.warmup_iters=4096"),
    ("seq_len_huge", "seq_len=1000000000000"), ("float16", "dtype='float16'"),
    ("trace_not_utf8", "workload.path="), ("trace_trillions", "workload.path="),
    # A model directory is set by model.path=, and its refusals name that key.
    ("model_json", "model.path="), ("model_empty_weights", "model.path="), ("model_zero_layers", "model.path="),
    ("model_rope_table", "model.path="),
])
def test_bad_input_is_one_line_exit_2_no_traceback_no_result(tmp_path, case, key):
    if case == "float16":
        from sarathi_lab.host_features import cpu_has_onednn_fp16
        if cpu_has_onednn_fp16():
            pytest.skip("this CPU's oneDNN runs float16")
    out = tmp_path / "run"
    proc = _run(*SMOKE, *_bad(tmp_path, case), f"hydra.run.dir={out}", cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    # README's promise: one `error:` line (not a logged [ERROR] record), as a bad command line gives.
    errors = [line for line in output.splitlines() if "error:" in line or "[ERROR]" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}"), output
    assert not list(tmp_path.rglob("metrics*.json"))


def test_the_what_if_kv_cache_warning_is_logged_once_per_job(tmp_path):
    # 42.7 GiB of KV cache beside LLaMA-13B on a 48 GB A6000 (experiments/sim/decode_speedup.yaml); the
    # preflight and the LLM both size it, and each had warned.
    out = tmp_path / "run"
    proc = _run(*SMOKE, "executor=sim", "model=llama-13b", "engine.sim_device=a6000", "engine.num_kv_blocks=3500",
                "engine.sim_kv_beyond_device=true", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for output in (proc.stdout + proc.stderr, (out / "run.log").read_text()):
        assert output.count("what-if KV cache (sim_kv_beyond_device): 3500 blocks") == 1, output


@pytest.mark.e2e
def test_a_refused_rerun_changes_no_byte_of_the_finished_run(tmp_path):
    out = tmp_path / "run"
    assert _run(*SMOKE, f"hydra.run.dir={out}", cwd=tmp_path).returncode == 0
    tree = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", "status.json", "run.log"} <= \
        {p.relative_to(out).as_posix() for p in tree}
    for args in ([], ["on_existing=overwrite", "engine.num_kv_blocks=2"],
                 ["on_existing=overwrite", "engine.max_model_len=4096"], ["on_existing=skip", "chunk=8"]):
        proc = _run(*SMOKE, *args, f"hydra.run.dir={out}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == tree
    assert json.loads((tmp_path / ".run.next" / "status.json").read_text())["status"] == "failed"
    # An overwrite that passes replaces the run whole, its Hydra record included.
    assert _run(*SMOKE, "chunk=8", "on_existing=overwrite", f"hydra.run.dir={out}", cwd=tmp_path).returncode == 0
    assert "chunk=8" in (out / ".hydra" / "overrides.yaml").read_text()
    assert json.loads((out / "status.json").read_text())["status"] == "ok"


@pytest.mark.e2e
def test_cfg_job_says_what_the_experiments_sweep_overrides(tmp_path):
    proc = _run("experiment=pd_ratio", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("name: pd_ratio")
    assert proc.stderr.strip().startswith("# -m runs one job per combination of chunk: 64,128; pd_ratio: 4,8,16,32,64")


@pytest.mark.slow
def test_an_installed_wheel_runs_outside_the_repository(tmp_path):
    """`pip install .` (a wheel, not an editable link): configs, experiments and the sample trace ship
    inside the package, and relative trace paths still resolve from the working directory first."""
    # Built from a copy: setuptools writes build/ into the tree it builds.
    repo = shutil.copytree(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), tmp_path / "src",
                           ignore=shutil.ignore_patterns(".git", ".venv", "outputs", "build", "*.egg-info",
                                                         "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(repo)], check=True, timeout=600, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, timeout=600, capture_output=True)
    work = tmp_path / "elsewhere"
    (work / "data" / "traces").mkdir(parents=True)
    (work / "data" / "traces" / "mine.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,40,8\n")
    env = ENV | {"PYTHONPATH": str(tmp_path / "site")}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *args], capture_output=True, text=True,
                              timeout=300, check=False, cwd=work, env=env)

    shown = run("experiment=ci/pd_ratio", "--cfg", "job")
    assert shown.returncode == 0 and "scale: ci" in shown.stdout, shown.stderr[-2000:]
    # Refused by the KV check, which comes after the trace is read: the shipped sample and a local file.
    for trace, tokens in (("data/traces/sample.csv", "fewer than one request of"), ("data/traces/mine.csv", "of 48")):
        proc = run("experiment=smoke", "logger=none", "workload=trace", f"workload.path={trace}",
                   "engine.num_kv_blocks=1", f"hydra.run.dir={work / 'out'}")
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "the KV cache holds 16 tokens, fewer than one request of" in output \
            and tokens in output, output[-2000:]
        assert str(tmp_path / "site") in _python_at(env, work)


def _python_at(env, cwd) -> str:
    return subprocess.run([sys.executable, "-c", "import sarathi_lab; print(sarathi_lab.__file__)"],
                          capture_output=True, text=True, timeout=60, check=True, env=env, cwd=cwd).stdout
