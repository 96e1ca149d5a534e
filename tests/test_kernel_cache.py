"""The kernel cache loads only what this user built (kernels/sarathi_kernels/cpu_build.py): a private
directory, each build's SHA-256 recorded, a cached file checked before dlopen. Each case plants real
files in a real cache and starts a fresh interpreter, as a user's next run would. A stand-in compiler
answers ``--version`` as the real one (so the hashed name is the real one's) and fails every build:
a file that was refused is then visibly not loaded (kernels unavailable, torch's ops), and a planted
library's constructor would leave a marker if it ran."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sarathi_kernels import cpu_build

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which(cpu_build.compiler())
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler here")
PROBE = "import torch; from sarathi_kernels import cpu_ops; print(cpu_ops.supports(torch.zeros(1)))"


def _fresh(cache: Path, cxx: str | None = None, umask: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {"XDG_CACHE_HOME": str(cache)}
    if cxx:
        env["CXX"] = cxx
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False, preexec_fn=None if umask is None else (lambda: os.umask(umask)))


@pytest.fixture
def failing_cxx(tmp_path) -> str:
    script = tmp_path / "cxx"
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then exec {CXX} "$@"; fi\necho "no build" >&2\nexit 1\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    """A library at the cache's hashed name whose constructor writes a marker file, and the marker's path."""
    marker = tmp_path / "ran"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void f(void) '
                   f'{{ FILE* o = fopen("{marker}", "w"); if (o) fclose(o); }}\n')
    kernels = tmp_path / "cache" / "sarathi_lab" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    so = kernels / f"cpu_kernels-{cpu_build._build_key(cpu_build.compiler())}.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return so, marker


def _record(so: Path) -> None:
    so.with_name(so.name + ".sha256").write_text(hashlib.sha256(so.read_bytes()).hexdigest() + "\n")


def _one_line(stderr: str, *words: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.startswith("sarathi_lab:")]
    return len(stderr.splitlines()) == len(lines) and all(any(w in line for line in lines) for w in words)


def test_a_library_planted_without_a_record_is_never_loaded(planted, failing_cxx, tmp_path):
    so, marker = planted
    done = _fresh(tmp_path / "cache", failing_cxx)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "the planted library's code ran"
    assert done.stdout.split() == ["False"]
    assert _one_line(done.stderr, f"{so} has no recorded hash", "building them again", "unavailable"), done.stderr


def test_a_library_writable_by_others_is_never_loaded(planted, failing_cxx, tmp_path):
    # As a umask-000 build, or a file another user of a shared cache could rewrite, would leave it.
    so, marker = planted
    _record(so)
    so.chmod(0o666)
    done = _fresh(tmp_path / "cache", failing_cxx)
    assert not marker.exists() and done.stdout.split() == ["False"], done.stderr
    assert _one_line(done.stderr, "writable by this user only"), done.stderr


def test_a_truncated_library_is_rebuilt_not_loaded(planted, failing_cxx, tmp_path):
    # Its record is the whole file's: what a full disk or a kill mid-copy leaves behind. Loading it
    # killed the process with SIGBUS.
    so, marker = planted
    _record(so)
    so.write_bytes(so.read_bytes()[:1000])
    done = _fresh(tmp_path / "cache", failing_cxx)
    assert done.returncode == 0 and not marker.exists() and done.stdout.split() == ["False"], done.stderr
    assert _one_line(done.stderr, "does not hash to its record"), done.stderr


def test_a_cache_owned_by_another_user_is_refused_in_one_line(planted, failing_cxx, tmp_path):
    # Even with a record that matches: whoever owns the directory chose both.
    so, marker = planted
    _record(so)
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user here")
    os.chown(so.parent, 65534, -1)
    done = _fresh(tmp_path / "cache", failing_cxx)
    assert done.returncode == 0 and not marker.exists() and done.stdout.split() == ["False"], done.stderr
    assert _one_line(done.stderr, f"{so.parent} belongs to uid 65534", "unavailable"), done.stderr


@pytest.mark.slow
def test_a_build_under_umask_000_is_private_and_recorded_and_a_truncated_one_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    done = _fresh(cache, umask=0)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
    kernels = cache / "sarathi_lab" / "kernels"
    assert stat.S_IMODE(kernels.stat().st_mode) == 0o700
    (so,) = kernels.glob("cpu_kernels-*.so")
    assert stat.S_IMODE(so.stat().st_mode) == 0o600
    whole = so.read_bytes()
    assert so.with_name(so.name + ".sha256").read_text().strip() == hashlib.sha256(whole).hexdigest()
    so.write_bytes(whole[: len(whole) // 2])
    done = _fresh(cache)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
    assert _one_line(done.stderr, "does not hash to its record", "building them again"), done.stderr
    assert so.read_bytes() != whole[: len(whole) // 2]
