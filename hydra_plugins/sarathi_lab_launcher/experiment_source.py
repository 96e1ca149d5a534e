"""Serves an experiment's variants to Hydra from the sections of its one file
(sarathi_lab/harness/experiment_variants.py): ``experiment=ci/pd_ratio`` is section ``ci`` of
``conf/experiment/pd_ratio.yaml``, and ``experiment=pd_ratio`` that file without its sections.

A config source placed before sarathi_lab's own conf folder, only where that folder is the primary
config's (any other Hydra app's search path is left as it is); what it does not hold, every other
config, is the folder's. Hydra finds config sources and search path plugins only in the
hydra_plugins package: hence this location.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

SCHEME = "sarathi-experiment"
GROUP = "experiment"


def _variants():
    # Imported on use: Hydra imports every hydra_plugins module at start, in any app.
    from sarathi_lab.harness import experiment_variants

    return experiment_variants


def _own_conf_dir() -> str | None:
    spec = importlib.util.find_spec("sarathi_lab")
    if spec is None or spec.origin is None:
        return None
    return os.path.realpath(Path(spec.origin).parent / "conf")


class ExperimentSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        main = next((e for e in search_path.get_path() if e.provider == "main"), None)
        own = _own_conf_dir()
        if main is None or not main.path or own is None:
            return
        # @hydra.main passes a folder, initialize_config_dir a file:// one, a module a pkg:// one.
        folder = main.path.removeprefix("file://")
        if main.path == "pkg://sarathi_lab.conf" or ("://" not in folder and os.path.realpath(folder) == own):
            search_path.prepend("sarathi_lab experiment variants", f"{SCHEME}://{own}",
                                anchor=SearchPathQuery(provider="main"))


class ExperimentSource(ConfigSource):
    """The group's sectioned files; ``path`` is the conf folder."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _node(self, config_path: str) -> dict | None:
        group, _, rest = config_path.removesuffix(".yaml").partition("/")
        if group != GROUP or not rest:
            return None
        v = _variants()
        return v.variant(Path(self.path), rest) if "/" in rest else v.experiment(Path(self.path), rest)

    def load_config(self, config_path: str) -> ConfigResult:
        node = self._node(config_path)
        if node is None:
            raise ConfigLoadError(f"Config not found : {self.full_path()}/{config_path}")
        # Every experiment and variant is a `# @package _global_` file; the header is the file's.
        base = config_path.removesuffix(".yaml").split("/")
        file = Path(self.path, GROUP, f"{base[1] if len(base) == 2 else base[2]}.yaml")
        header = ConfigSource._get_header_dict(file.read_text(encoding="utf-8")[:512])
        return ConfigResult(config=OmegaConf.create(node), path=self.full_path(),
                            provider=self.provider, header=header)

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        words = config_path.strip("/").split("/")
        if words[0] != GROUP:
            return False
        return any(n.startswith("/".join(words[1:]) + "/") for n in self._names()) if len(words) > 1 \
            else True

    def is_config(self, config_path: str) -> bool:
        return self._node(config_path) is not None

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        words = config_path.strip("/").split("/")
        if words[0] != GROUP:
            return []
        prefix = "/".join(words[1:])
        prefix = f"{prefix}/" if prefix else ""
        found = set()
        for name in self._names():
            if not name.startswith(prefix):
                continue
            head, sep, _ = name[len(prefix):].partition("/")
            kind = ObjectType.GROUP if sep else ObjectType.CONFIG
            if results_filter is None or results_filter == kind:
                found.add(head)
        return sorted(found)

    def _names(self) -> list[str]:
        return _variants().names(Path(self.path))
