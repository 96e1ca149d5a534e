"""An experiment at a scale, from its overlay ``experiment=<scale>/<name>``: section ``<scale>`` of
``conf/experiment/<name>.yaml`` (the one place its keys are written; experiment_variants.py), which
the GPU suite and the benches pass on the command line."""
from __future__ import annotations

from omegaconf import OmegaConf

from sarathi_lab.harness import CONF_DIR, experiment_variants

# gpu: the paper's model scaled to a time limit; own: the paper's setting; dry: one tiny CPU job.
SCALES = ("gpu", "own", "dry")


def overlay(name: str, scale: str, part: str = "") -> dict:
    """The overlay as written: its defaults (the experiment first), then its keys."""
    variant = f"{scale}/{name}" + (f"/{part}" if part else "")
    if not experiment_variants.exists(CONF_DIR, variant):
        section = f"{scale}/{part}" if part else scale
        raise ValueError(f"error: experiment={variant} is invalid: neither section {section} of "
                         f"experiment/{name}.yaml nor experiment/{variant}.yaml; allowed: the "
                         f"experiments with a {scale} overlay")
    return experiment_variants.raw(CONF_DIR, variant)


def overrides(name: str, scale: str, part: str = "") -> tuple[str, ...]:
    """The overlay's config: the scale's keys, then the experiment's, then its part's."""
    return tuple(_overrides_of(overlay(name, scale, part)))


def shared(scale: str) -> tuple[str, ...]:
    return tuple(_overrides_of(_load(f"/scale/{scale}")))


def _load(entry: str) -> dict:
    """A defaults entry's config as written: /scale/gpu, /experiment/gpu/capacity (a section)."""
    group, _, path = entry.lstrip("/").partition("/")
    if group == experiment_variants.GROUP:
        return experiment_variants.raw(CONF_DIR, path)
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{path}.yaml"), resolve=False)


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


def _overrides_of(raw: dict) -> list[str]:
    found: list[str] = []
    for entry in raw.get("defaults", []):
        if isinstance(entry, dict):     # override /<group>: <choice>
            (key, choice), = entry.items()

            found.append(f"{key.removeprefix('override').strip().lstrip('/')}={choice}")
        elif entry.startswith("/scale/") or entry.count("/") > 2:
            # another overlay or a scale: theirs first (/experiment/<name> is experiment=<name>)
            found += _overrides_of(_load(entry))
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
