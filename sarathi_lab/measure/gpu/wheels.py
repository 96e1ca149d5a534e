"""Download the wheels a GPU machine without a package registry lacks, at the versions
installed here, for CPython 3.12 manylinux x86_64, with what they need that its image lacks
(machine_packages.txt). A package with only a source archive is built here, and kept only if pure.

    python -m sarathi_lab.measure gpu_wheels            # hydra-core, omegaconf, antlr4 into .whl/
    python -m sarathi_lab.measure gpu_wheels --wandb    # also wandb and what it needs
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
CORE = ("hydra-core", "omegaconf", "antlr4-python3-runtime")
# pip matches each manylinux tag exactly, so name the usual ones.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
TARGET = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3",
                                  "implementation_name": "cpython",
                                  "platform_python_implementation": "CPython",
                                  "sys_platform": "linux", "platform_system": "Linux",
                                  "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
# The tags pip installs there: CPython 3.12's, abi3 and pure Python.
TARGET_TAGS = frozenset(cpython_tags((3, 12), platforms=PLATFORMS)) | frozenset(
    compatible_tags((3, 12), "cp312", platforms=PLATFORMS))


def machine_packages() -> set[str]:
    lines = (HERE / "machine_packages.txt").read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line.strip() and not line.startswith("#")}


def pinned(name: str) -> str:
    """``name==version`` as installed here, else the bare name."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
                   check=True)


def fetch(spec: str, dest: Path) -> Path:
    """One wheel of ``spec`` for the GPU machine (built here if only a source exists)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    try:
        _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             "--implementation", "cp", *platforms, "-d", str(dest), spec)
    except subprocess.CalledProcessError:
        _pip("wheel", "--no-deps", "-w", str(dest), spec)
    # By name and version, not as the new file: pip downloads nothing when the wheel is there.
    req = Requirement(spec)
    for wheel in sorted(dest.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(wheel.name)
        if (name == canonicalize_name(req.name)
                and req.specifier.contains(version, prereleases=True)):
            break
    else:
        raise SystemExit(f"pip produced no wheel for {spec}")
    if not installs_there(wheel.name):
        raise SystemExit(f"{wheel.name}: built for this machine only, "
                         "it would not install on the GPU machine")
    return wheel


def installs_there(wheel_name: str) -> bool:
    """Whether pip on the GPU machine takes this wheel (not one built for this interpreter)."""
    return not parse_wheel_filename(wheel_name)[3].isdisjoint(TARGET_TAGS)


def requirements(wheel: Path) -> list[Requirement]:
    """Its requirements with markers evaluated for the GPU machine, extras left out."""
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_name).decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


def download(names: list[str], dest: Path) -> list[Path]:
    """``names`` and, recursively, what they need that the machine lacks."""
    dest.mkdir(parents=True, exist_ok=True)
    have, done, wheels = machine_packages(), set(), []
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop(0))
        if name in done or name in have:
            continue
        done.add(name)
        wheel = fetch(pinned(name), dest)
        wheels.append(wheel)
        todo += [r.name for r in requirements(wheel)]
    return wheels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.measure gpu_wheels",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=Path(".whl"),
                        help="where the wheels go (git-ignored)")
    parser.add_argument("--wandb", action="store_true", help="also wandb and its requirements")
    args = parser.parse_args(argv)
    wheels = download([*CORE, *(["wandb"] if args.wandb else [])], args.dest)
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.dest}/: copy them to the GPU "
          "machine with the checkout")
