"""Attention backends register on import; each module here is imported, a backend its own file."""
from sarathi_lab.attention import torch_backend, triton_backend  # noqa: F401
from sarathi_lab.attention.backend import AttentionBackend, backend_class, backend_names, make_backend, register_backend
from sarathi_lab.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "backend_class", "backend_names", "make_backend",
           "register_backend"]
