"""An experiment at a scale, from its overlay ``conf/experiment/<scale>/<name>.yaml`` (the one place
its keys are written), which the GPU suite and the benches pass on the command line."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from sarathi_lab.harness import CONF_DIR

# gpu: the paper's model scaled to a time limit; own: the paper's setting; dry: one tiny CPU job.
SCALES = ("gpu", "own", "dry")


def overlay(name: str, scale: str, part: str = "") -> Path:
    path = CONF_DIR / "experiment" / scale / name / f"{part}.yaml" if part else \
        CONF_DIR / "experiment" / scale / f"{name}.yaml"
    if not path.is_file():
        what = f"experiment={scale}/{name}" + (f"/{part}" if part else "")
        where = (CONF_DIR / "experiment" / scale).relative_to(CONF_DIR)
        raise ValueError(f"error: {what} is invalid: no {path.relative_to(CONF_DIR)}; allowed: "
                         f"the experiments with a {scale} overlay in {where}/")
    return path


def overrides(name: str, scale: str, part: str = "") -> tuple[str, ...]:
    """The overlay's config: the scale's keys, then the experiment's, then its part's."""
    return tuple(_overrides_of(overlay(name, scale, part)))


def shared(scale: str) -> tuple[str, ...]:
    return tuple(_overrides_of(CONF_DIR / "scale" / f"{scale}.yaml"))


def _text(value) -> str:
    """YAML's null and booleans in Hydra's spelling."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _flat(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _overrides_of(path: Path) -> list[str]:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    found: list[str] = []
    for entry in raw.get("defaults", []):
        if isinstance(entry, dict):     # override /<group>: <choice>
            (key, choice), = entry.items()

            found.append(f"{key.removeprefix('override').strip().lstrip('/')}={choice}")
        elif entry.startswith("/scale/") or entry.count("/") > 2:
            # another overlay or a scale: theirs first (/experiment/<name> is experiment=<name>)
            found += _overrides_of(CONF_DIR / f"{entry.lstrip('/')}.yaml")
    own = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
    found += [f"{key}={_text(value)}" for key, value in _flat(own)]

    sweeper = raw.get("hydra", {}).get("sweeper", {})
    if "params" in sweeper:
        params = sweeper["params"]
        found += ["hydra.sweeper.params=null"] if params is None else \
            [f"{key}={_text(value)}" for key, value in params.items()]
    if sweeper.get("exclude"):
        found.append(f"{EXCLUDE}={_grammar(sweeper['exclude'])}")
    return found


# The sweeper's rules leaving out jobs of its product (hydra_plugins/.../sweeper.py).
EXCLUDE = "hydra.sweeper.exclude"


def _grammar(value) -> str:
    """A YAML list or mapping in Hydra's override grammar: [{key:value,key:[a,b]}]."""
    if isinstance(value, list):
        return "[" + ",".join(_grammar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_grammar(v)}" for k, v in value.items()) + "}"
    return _text(value)
