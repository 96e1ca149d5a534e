"""Attention backends register themselves with their capabilities (attention/backend.py), the way
schedulers do: attention= picks by name, auto by the device, and CUDA graphs ask the backend."""
from __future__ import annotations

import pytest
import torch

from sarathi_lab.attention import backend_class, backend_names, make_backend
from sarathi_lab.attention.torch_backend import TorchAttention
from sarathi_lab.attention.triton_backend import TritonAttention
from sarathi_lab.config import ATTENTIONS
from sarathi_lab.model.cuda_graphs import can_replay


def test_every_backend_is_registered_and_allowed_by_the_config():
    assert set(backend_names()) == set(ATTENTIONS) - {"auto"}
    assert backend_class("torch", torch.device("cpu")) is TorchAttention
    assert backend_class("triton", torch.device("cpu")) is TritonAttention


def test_auto_takes_triton_on_cuda_and_torch_elsewhere():
    assert backend_class("auto", torch.device("cuda")) is TritonAttention
    assert backend_class("auto", torch.device("cpu")) is TorchAttention
    assert backend_class("auto", torch.device("meta")) is TorchAttention
    assert isinstance(make_backend("auto", torch.device("cpu")), TorchAttention)


def test_only_a_replayable_backend_on_cuda_is_captured():
    assert TritonAttention.replayable and not TorchAttention.replayable
    assert not can_replay(TorchAttention(), torch.device("cuda"))
    assert TritonAttention.devices == ("cuda",)


def test_an_unknown_backend_is_refused_naming_the_allowed():
    with pytest.raises(ValueError, match=r"attention='flash' is not a backend; allowed: auto, torch, triton"):
        make_backend("flash", torch.device("cpu"))
