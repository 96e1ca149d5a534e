from sarathi_lab.model.decoder import SUPPORTED_ARCHITECTURES, CausalLM
from sarathi_lab.model.loader import ModelLoadError, build_model, load_config
from sarathi_lab.model.presets import PRESETS

__all__ = ["PRESETS", "SUPPORTED_ARCHITECTURES", "CausalLM", "ModelLoadError", "build_model", "load_config"]
