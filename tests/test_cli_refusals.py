"""Every command of the project refuses a bad command line the same way: one line starting with
``error:``, naming what was wrong, and exit 2, before any work (argparse printed its usage block
above the message, 4-15 lines). Each case starts the command in a fresh interpreter, as a user does."""
from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sarathi_lab.measure.gpu import state

ROOT = Path(__file__).resolve().parents[1]


def _files(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    not_tar = tmp_path / "suite.tar.gz"
    not_tar.write_text("hello\n")
    return {"file": a_file, "not_tar": not_tar}


CASES = {
    "run: unknown key": (["sarathi_lab.run", "chunkk=3"], "chunkk"),
    "run: a name leaving outputs": (["sarathi_lab.run", "name=../../escaped"], "name='../../escaped'"),
    "run: output dir is a file": (["sarathi_lab.run", "hydra.run.dir={file}"], "a_file is invalid: it is a file"),
    "run: sweep dir under a file": (["sarathi_lab.run", "-m", "chunk=32,64", "hydra.sweep.dir={file}/s"],
                                    "which is a file"),
    "produce: unknown experiment": (["sarathi_lab.produce", "nope"], "'nope'"),
    "produce: root is a file": (["sarathi_lab.produce", "--root", "{file}"], "a_file"),
    "produce: root under a file": (["sarathi_lab.produce", "--root", "{file}/below"], "a_file"),
    "bench: unknown benchmark": (["sarathi_lab.measure", "nope"], "'nope'"),
    "bench: bad value": (["sarathi_lab.measure", "sampling", "--reps", "0"], "--reps"),
    "bench: unknown option": (["sarathi_lab.measure", "ceilings", "--bogus"], "--bogus"),
    "gpu: bad budget": (["sarathi_lab.measure", "gpu", "--budget-min", "-1"], "--budget-min"),
    "gpu: unknown step": (["sarathi_lab.measure", "gpu", "--steps", "nope"], "nope"),
    "gpu: restore from a non-tar": (["sarathi_lab.measure", "gpu", "--dry-run", "--out", "{tmp}/gpu",
                                     "--restore", "{not_tar}"],
                                    "suite.tar.gz is invalid"),
    "measure sim_pipeline: bad count": (["sarathi_lab.measure", "sim_pipeline", "--requests", "0"], "--requests"),
    # Checked against memory before the trace is drawn (it died allocating 7.45 GiB).
    "measure sim_speed: more requests than memory holds": (
        ["sarathi_lab.measure", "sim_speed", "--requests", "1000000000"],
        "--requests=1000000000 is invalid here: its trace and the simulator's records need about"),
    # Hydra's own config errors at the edge (a MissingConfigException traceback).
    "run: a launcher mistyped beside a bad value": (
        ["sarathi_lab.run", "-m", "hydra/launcher=submitit_locl", "chunk=-1"],
        "hydra/launcher='submitit_locl' is invalid: allowed values are basic, submitit_local,"),
    "run: a simulator knob on the real engine": (
        ["sarathi_lab.run", "engine.sim_pp=2"],
        "engine.sim_pp=2 is invalid: engine.sim_pp is a simulator setting: add executor=sim"),
    # Refused before any sweep (it pointed to a sweep_summary.json never written).
    "produce: an unknown override": (
        ["sarathi_lab.produce", "pd_ratio", "--scale", "ci", "--root", "{tmp}/outputs", "-o", "bogus.key=1"],
        "error: -o bogus.key=1 is invalid: bogus.key is not a known key"),
    # A value the run refuses (its own refusal, once: the sweep's line and a summary were two).
    "produce: an override's value of the wrong type": (
        ["sarathi_lab.produce", "pd_ratio", "--sim", "--root", "{tmp}/outputs", "-o", "chunk=abc"],
        "error: -o chunk='abc' is invalid: must be of type int"),
    "measure sim_pipeline: out under a file": (["sarathi_lab.measure", "sim_pipeline", "--smoke",
                                               "--out", "{file}/x"],
                                             "a_file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refused_command_line_is_one_line_and_exit_2(case, tmp_path):
    args, named = CASES[case]
    paths = {k: str(v) for k, v in _files(tmp_path).items()} | {"tmp": str(tmp_path)}
    # This checkout's package, not the one installed (the run starts in tmp_path).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"XDG_CACHE_HOME": str(tmp_path),
                                                                             "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", *(a.format(**paths) for a in args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "gpu" / "summary.json").exists()


def _archive(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "a directory"])
def test_restore_from_a_damaged_archive_is_refused_naming_it_and_writes_no_half_file(damage, tmp_path):
    archive = tmp_path / "suite.tar.gz"
    files = {"a/result.json": b"{}" * 10, "b/result.json": os.urandom(200_000)}
    whole = _archive(files)
    if damage == "a directory":
        archive.mkdir()
    else:
        archive.write_bytes(whole[: len(whole) * 2 // 3] if damage == "truncated" else gzip.decompress(whole)[:700])
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=f"--restore={archive} is invalid: not a readable tar"):
        state.restore(out, archive)
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert all(files.get(name) == data for name, data in written.items()), sorted(written)


# A config refused once the run has started (Hydra has composed it): the same one `error:` line and exit 2,
# naming the key as the user sets it (nested keys in full, and so the way out it offers). Each starts the
# run's entry point as `python -m sarathi_lab.run` does, after the patches that make the refusal this
# machine's whatever it is: memory as a 20 GiB machine has it, a CPU with bf16 units and no float16.
PATCHES = ("import runpy, sys\n"
           "import sarathi_lab.host_features as host, sarathi_lab.model.memory as memory\n"
           "import sarathi_lab.plan as plan\n"
           "memory.device_memory_bytes = lambda device: 20 * 2**30\n"
           "host.cpu_has_bf16_units = lambda: True\n"
           "plan.cpu_has_onednn_fp16 = lambda: False\n"
           "sys.argv = ['sarathi_lab.run', *sys.argv[1:]]\n"
           "runpy.run_module('sarathi_lab.run', run_name='__main__')\n")
RUN_CASES = {
    # 12.6 GiB of weights; the 37.7 GiB counted are those and the CPU GEMM's two packed copies.
    "weights beside packed copies": (
        ["model=llama2-7b", "device=cpu"],
        ("error: model='llama2-7b' is invalid here: its weights take 12.6 GiB in bfloat16 and the CPU GEMM's 2 "
         "packed copies of them 25.1 GiB more (37.7 GiB in all), more than the 20.0 GiB available on cpu; allowed: "
         "engine.cpu_linear=aten, which packs no copy (12.6 GiB in all; its decode batches run slower: "
         "docs/cpu_engine.md), or a smaller model or dtype")),
    "a model directory that is not one": (
        ["model=hf", "model.path={tmp}/nowhere"],
        ("error: model.path='{tmp}/nowhere' is invalid: it is neither a preset (tiny, cpu-small, llama2-7b, "
         "llama-13b, llama-33b, mistral-7b, yi-34b, llama2-70b, falcon-180b) nor a local directory (a Hugging Face "
         "model's config.json and *.safetensors)")),
    "a path beside a preset": (
        ["model.path={tmp}/nowhere"],
        ("error: model.path='{tmp}/nowhere' is invalid with model=cpu-small: a preset reads no directory; allowed: "
         "null, or model=hf to load that directory")),
    "float16 where oneDNN has none": (
        ["dtype=float16", "device=cpu"],
        ("error: dtype='float16' is invalid: this CPU's oneDNN has no float16 matmul (it needs avx_ne_convert or "
         "avx512_fp16); allowed here: bfloat16, float32, or float16 with engine.cpu_linear=aten")),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_a_refused_config_is_one_error_line_naming_the_full_key_and_exit_2(case, tmp_path):
    args, line = RUN_CASES[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SARATHI", "WANDB"))}
    done = subprocess.run([sys.executable, "-c", PATCHES, *(a.format(tmp=tmp_path) for a in args), "logger=none",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stdout[-1000:] + done.stderr[-2000:]
    # The one line, and no logged [ERROR] record of it on either stream.
    assert done.stderr.splitlines() == [line.format(tmp=tmp_path)], done.stdout + done.stderr
    assert "[ERROR]" not in done.stdout and not list(tmp_path.rglob("metrics*.json"))
