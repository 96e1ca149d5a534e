"""An experiment's variants, written as sections of its one file: ``conf/experiment/NAME.yaml``
holds the experiment and, under ``variants:``, what each scale changes (``ci``, ``dry``, ``sim``,
``gpu``, ``own``; a part of a scale's sweep as ``gpu/PART``). ``experiment=ci/NAME`` composes
section ``ci`` as if it were a file ``ci/NAME.yaml`` (Hydra is served the sections, and the
experiment without them, by hydra_plugins/sarathi_lab_launcher/experiment_source.py); the GPU suite
reads the same sections (harness/scales.py). A variant written as a file of its own,
``ci/NAME.yaml``, works as before.

A section includes its base first, as the file did with ``- /experiment/NAME``: the experiment, and
for a part its scale's section; a section whose defaults name another experiment or variant
(``- /experiment/capacity_sim``, ``- /experiment/gpu/NAME``) includes that one instead."""
from __future__ import annotations

from pathlib import Path

from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

SECTIONS = "variants"
SCALES = ("ci", "dry", "sim", "gpu", "own")
GROUP = "experiment"


class VariantError(ConfigCompositionException, ValueError):
    """A malformed ``variants:``: Hydra's kind of error, which the CLI refuses in one line."""


def _sections(conf_dir: Path, name: str) -> dict:
    """{section: its content} of experiment NAME's file; {} where it has none."""
    path = Path(conf_dir) / GROUP / f"{name}.yaml"
    if "/" in name or not path.is_file():
        return {}
    found = OmegaConf.to_container(OmegaConf.load(path), resolve=False).get(SECTIONS) or {}
    for key, body in found.items():
        scale, _, part = key.partition("/")
        if scale not in SCALES or "/" in part or not isinstance(body, dict):
            raise VariantError(f"{path}: {SECTIONS}.{key} is invalid: allowed are sections "
                               f"{', '.join(SCALES)} (a part as SCALE/PART), each a mapping")
    return found


def _split(variant: str) -> tuple[str, str, str] | None:
    """'own/capacity/strict' -> ('capacity', 'own', 'strict'); None where it names no variant."""
    words = variant.split("/")
    if len(words) not in (2, 3) or words[0] not in SCALES:
        return None
    return words[1], words[0], words[2] if len(words) == 3 else ""


def _names_another(entry) -> bool:
    """Whether a defaults entry includes an experiment or a variant, not a shared ``_`` file."""
    return isinstance(entry, str) and entry.startswith(f"/{GROUP}/") \
        and not entry.rsplit("/", 1)[-1].startswith("_")


def variant(conf_dir: Path, path: str) -> dict | None:
    """Variant ``path`` ('ci/pd_ratio', 'own/capacity/strict') of the group, as the file it stands
    for: its defaults with its base first; None where no section holds it."""
    found = _split(path)
    if found is None:
        return None
    name, scale, part = found
    body = _sections(conf_dir, name).get(f"{scale}/{part}" if part else scale)
    if body is None:
        return None
    body = dict(body)
    defaults = list(body.get("defaults") or [])
    base = f"/{GROUP}/{scale}/{name}" if part else f"/{GROUP}/{name}"
    if not any(_names_another(d) for d in defaults):
        defaults.insert(0, base)
    return {"defaults": defaults, **{k: v for k, v in body.items() if k != "defaults"}}


def experiment(conf_dir: Path, name: str) -> dict | None:
    """Experiment NAME without its sections; None where its file has none."""
    path = Path(conf_dir) / GROUP / f"{name}.yaml"
    if "/" in name or not path.is_file():
        return None
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if SECTIONS not in raw:
        return None
    _sections(conf_dir, name)   # checked
    return {k: v for k, v in raw.items() if k != SECTIONS}


def names(conf_dir: Path) -> list[str]:
    """Every variant the sections hold, as ``experiment=`` writes it ('ci/pd_ratio')."""
    found = []
    for path in sorted((Path(conf_dir) / GROUP).glob("*.yaml")):
        for key in _sections(conf_dir, path.stem):
            scale, _, part = key.partition("/")
            found.append(f"{scale}/{path.stem}" + (f"/{part}" if part else ""))
    return found


def exists(conf_dir: Path, path: str) -> bool:
    """Whether ``experiment=PATH`` names a config: a section or a file."""
    file = Path(conf_dir) / GROUP / f"{path}.yaml"
    return variant(conf_dir, path) is not None or file.is_file()


def raw(conf_dir: Path, path: str) -> dict:
    """Config ``experiment=PATH`` as written, from its section or its file."""
    found = variant(conf_dir, path)
    if found is not None:
        return found
    file = Path(conf_dir) / GROUP / f"{path}.yaml"
    return OmegaConf.to_container(OmegaConf.load(file), resolve=False)
