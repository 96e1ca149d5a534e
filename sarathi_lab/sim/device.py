"""A device's ceilings and kernels' efficiency: GPUs from the YAML here, ``cpu`` measured."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from sarathi_kernels.cpu_build import cpuinfo

from sarathi_lab import host_memory
from sarathi_lab.config import AS_WRITTEN, DTYPE_BYTES, ConfigError, check_choice
from sarathi_lab.host_features import run_dtype
from sarathi_lab.sim.calibration import Calibration, check_keys

# calibration_cli writes their fitted part
DEVICES_DIR = Path(__file__).with_name("devices")
GPU_DEVICES = tuple(sorted(p.stem for p in DEVICES_DIR.glob("*.yaml")))
DEVICES = (*GPU_DEVICES, "cpu")
CEILING_FIELDS = ("copy_gbps", "matmul_gflops")
MEASURE_COMMAND = "python -m sarathi_lab.measure cpu_ceilings"
CEILINGS_ENV = "SARATHI_CPU_CEILINGS"


# A tile of 0.5 tokens would pad nothing and read a chunk's context twice per token.
INTEGER_FIELDS = ("memory_bytes", "tile_tokens", "attention_tile")
# Kernels at a device's peaks: efficiencies 1, no tiles, no launch floor or host time, a chunk's
# keys and values read once (as the CPU kernel does, and as no GPU kernel beats).
AT_PEAKS = {"tile_tokens": 1, "attention_tile": 1, "gemm_flops_efficiency": 1.0,
            "attention_flops_efficiency": 1.0, "bandwidth_efficiency": 1.0,
            "attention_bandwidth_efficiency": 1.0, "kernel_floor_s": 0.0, "host_overhead_s": 0.0,
            "host_per_token_s": 0.0, "kv_reread": False}


@dataclass(frozen=True)
class Device:
    name: str
    # Dense tensor-core (or measured matmul) FLOP/s in the simulated dtype, and memory bytes/s.
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: int
    # With kv_reread, attention reads a chunk's keys/values once per padded query block, as each
    # block of a GPU flash kernel streams them; else once per chunk.
    tile_tokens: int
    attention_tile: int
    # Shares of the ceilings that real kernels reach.
    gemm_flops_efficiency: float
    attention_flops_efficiency: float
    bandwidth_efficiency: float
    attention_bandwidth_efficiency: float
    kernel_floor_s: float
    host_overhead_s: float
    host_per_token_s: float
    kv_reread: bool = True
    sources: tuple[str, ...] = field(default=())
    # Fitted efficiencies (calibration.py), which sim_cost_model=calibrated reads instead.
    calibration: Calibration | None = None

    def __post_init__(self):
        if not isinstance(self.kv_reread, bool):
            raise ConfigError(f"sim.device.{self.name}.kv_reread", self.kv_reread,
                              "is invalid: must be true or false", keys=AS_WRITTEN)
        for f in dataclasses.fields(self):
            if f.name in ("name", "sources", "kv_reread", "calibration"):
                continue
            value = getattr(self, f.name)
            positive = f.name not in ("kernel_floor_s", "host_overhead_s", "host_per_token_s")
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value):
                why = "must be a finite number"
            elif f.name in INTEGER_FIELDS and (not float(value).is_integer() or value < 1):
                why = "must be an integer > 0"
            elif value < 0 or (positive and value == 0):
                why = f"must be {'> 0' if positive else '>= 0'}"
            elif f.name.endswith("_efficiency") and value > 1:
                why = "an efficiency is at most 1"
            else:
                continue
            raise ConfigError(f"sim.device.{self.name}.{f.name}", value, f"is invalid: {why}",
                              keys=AS_WRITTEN)

    def prepare_s(self, tokens: int) -> float:
        return self.host_overhead_s + self.host_per_token_s * tokens


# libyaml where PyYAML has it: a run loads device files several times.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_device(name: str, dtype: str = "bfloat16") -> Device:
    if name == "cpu":
        return cpu_device(dtype)
    check_choice("sim_device", name, DEVICES, AS_WRITTEN)
    raw = yaml.load((DEVICES_DIR / f"{name}.yaml").read_text(), Loader=_SAFE_LOADER)
    raw["sources"] = tuple(raw.get("sources", ()))
    if raw.get("calibration") is not None:
        raw["calibration"] = Calibration.from_dict(raw["calibration"],
                                                   f"sim.device.{name}.calibration")
    check_keys(Device, raw, f"sim.device.{name}")
    return Device(**raw)


def device_type(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda"


def device_dtype(device: str, dtype: str) -> str:
    """A CPU without bf16 matrix instructions runs bfloat16 as float32, as the engine does."""
    return run_dtype(dtype, device_type(device))


@dataclass(frozen=True)
class SimulatedDtype:
    """Read as a torch dtype (size, name) without importing torch."""
    name: str
    itemsize: int

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        # Equal to torch's dtype of that name: what a real engine's plan holds in its place.
        return str(other).removeprefix("torch.") == self.name

    def __hash__(self) -> int:
        return hash(self.name)


def simulated_dtype(device: str, dtype: str) -> SimulatedDtype:
    name = device_dtype(device, dtype)
    return SimulatedDtype(name, DTYPE_BYTES[name])


def cpu_name() -> str:
    """The key of its ceilings in a home shared by several machines."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_ceilings_path() -> Path:
    """CEILINGS_ENV names another (the tests' synthetic one)."""
    if os.environ.get(CEILINGS_ENV):
        return Path(os.environ[CEILINGS_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sarathi_lab" / "cpu_ceilings.json"


def cpu_ceilings_key(dtype: str) -> str:
    return f"{cpu_name()}|{device_dtype('cpu', dtype)}"


def read_cpu_ceilings(path: Path) -> dict:
    """{} where there is none; ValueError where damaged."""
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable ({e})") from None
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise ValueError("not an object of entries")
    for key, entry in entries.items():
        if not all(isinstance(entry.get(k), (int, float)) and not isinstance(entry[k], bool)
                   and math.isfinite(entry[k]) and entry[k] > 0 for k in CEILING_FIELDS):
            raise ValueError(f"its entry {key!r} has no positive {' and '.join(CEILING_FIELDS)}")
    return entries


def cpu_device(dtype: str = "bfloat16") -> Device:
    """This CPU's measured ceilings, its kernels at them (AT_PEAKS)."""
    path, key = cpu_ceilings_path(), cpu_ceilings_key(dtype)
    try:
        entry = read_cpu_ceilings(path).get(key)
        why = f"{path} has no entry {key!r}"
    except ValueError as e:
        entry, why = None, f"{path} is {e}"
    if entry is None:
        raise ConfigError("sim_device", "cpu", f"needs this CPU's measured ceilings: {why}; "
                          f"measure them with {MEASURE_COMMAND} --dtype {dtype}", keys=AS_WRITTEN)
    return Device(name="cpu", peak_flops=entry["matmul_gflops"] * 1e9,
                  memory_bandwidth=entry["copy_gbps"] * 1e9, memory_bytes=host_memory.total(),
                  sources=((f"measured on {key} with {entry.get('threads', '?')} threads at "
                            f"{entry.get('measured_at', '?')}, read from {path}"),), **AT_PEAKS)


def at_floors(device: Device) -> Device:
    """The device with every kernel at its peaks: the floor cost model's."""
    return dataclasses.replace(device, calibration=None, **AT_PEAKS)
