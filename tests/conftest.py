from __future__ import annotations

import os

import pytest
import torch

# no test downloads (this machine has no network): Hugging Face's hub reads this once, at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
