from sarathi_lab.attention.backend import ATTENTION_CHOICES, AttentionBackend, make_backend
from sarathi_lab.attention.metadata import AttentionMetadata

__all__ = ["ATTENTION_CHOICES", "AttentionBackend", "AttentionMetadata", "make_backend"]
