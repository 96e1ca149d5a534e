"""Which layers a stage holds: consecutive runs, the first stages one longer where uneven
(every stage keeps the embedding and LM head: small beside its layers)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from sarathi_lab.config import ConfigError, Key

_LAYER = re.compile(r"^layers\.(\d+)\.")


@dataclass(frozen=True)
class Stage:
    index: int
    count: int
    first: int  # its layers: [first, last)
    last: int

    @classmethod
    def of(cls, layers: int, count: int, index: int, model: str = "") -> Stage:
        if count > layers:
            raise ConfigError("pipeline_parallel", count, "is invalid for " + Key("model", model)
                              + f": it has {layers} layers, fewer than the stages",
                              f"at most {layers}")
        base, extra = divmod(layers, count)
        first = index * base + min(index, extra)
        return cls(index, count, first, first + base + (index < extra))

    @property
    def num_layers(self) -> int:
        return self.last - self.first

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.count - 1

    def local_name(self, name: str) -> str | None:
        match = _LAYER.match(name)
        if match is None:
            return name
        layer = int(match[1])
        if not self.first <= layer < self.last:
            return None
        return f"layers.{layer - self.first}." + name[match.end():]
