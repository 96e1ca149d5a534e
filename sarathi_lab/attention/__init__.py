from sarathi_lab.attention.backend import AttentionBackend, make_backend
from sarathi_lab.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "make_backend"]
