"""``tabular-noisy``: tabular-mlp's task, trained by plain SGD on 512 examples of which 12 have
a deliberately wrong label, with its training data and three checkpoints shipped, so its
influence index (``[models.influence]``, TracInCP) finds the wrong labels: they are the
training examples of highest self-influence.

``python -m model_registry.builtin.train tabular-noisy`` regenerates the weights, the data
(``influence/tabular-noisy/train.npz``: ``x`` and ``labels``) and the checkpoints
(``checkpoint-{1,2,3}.pt``, taken every ``EPOCHS // 3`` epochs, each with its learning rate).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from model_registry.builtin import tabular

N_TRAIN = 512
N_FLIPPED = 12
EPOCHS = 30
BATCH = 32
#: SGD's learning rate per third of the training (TracIn weighs each checkpoint by it)
LRS = (0.2, 0.1, 0.05)
SEED = 7
MARGIN = 0.3
FILES = Path(__file__).parent / "influence" / "tabular-noisy"


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training rows, their labels (some wrong), and which rows are wrong."""
    g = torch.Generator().manual_seed(SEED)
    x, y = tabular.make_data(N_TRAIN, g)
    # clearly wrong labels: rows at least MARGIN from both class boundaries
    s = x[:, tabular.RELEVANT[0]] + x[:, tabular.RELEVANT[1]]
    clear = ((s.abs() - tabular.THRESHOLD).abs() > MARGIN).nonzero().flatten()
    flipped = clear[torch.randperm(len(clear), generator=g)[:N_FLIPPED]].sort().values
    shift = torch.randint(1, len(tabular.LABELS), (N_FLIPPED,), generator=g)
    y = y.clone()
    y[flipped] = (y[flipped] + shift) % len(tabular.LABELS)
    return x, y, flipped


def train() -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The final state dict and the three checkpoints' (deterministic on one thread)."""
    torch.manual_seed(SEED)
    model = tabular.TabularMLP()
    x, y, _ = data()
    g = torch.Generator().manual_seed(SEED + 1)
    loss_fn = nn.CrossEntropyLoss()
    checkpoints = []
    per_stage = EPOCHS // len(LRS)
    for lr in LRS:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(per_stage):
            order = torch.randperm(N_TRAIN, generator=g)
            for start in range(0, N_TRAIN, BATCH):
                idx = order[start : start + BATCH]
                opt.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                opt.step()
        checkpoints.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return checkpoints[-1], checkpoints


def write(out: Path = FILES) -> list[Path]:
    """The data and the checkpoints under ``out``; the final weights are the built-in's."""
    out.mkdir(parents=True, exist_ok=True)
    x, y, _ = data()
    np.savez(out / "train.npz", x=x.numpy(), labels=y.numpy())
    _, checkpoints = train()
    paths = []
    for i, state in enumerate(checkpoints, 1):
        path = out / f"checkpoint-{i}.pt"
        torch.save(state, path)
        paths.append(path)
    return paths
