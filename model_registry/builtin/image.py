"""``image-cnn``: 3x32x32 images in, 4 classes out; the class is the quadrant of a bright square.

Ground truth: each image is dim noise in [0, 0.3) with one bright square (side 4 to 8, every
channel in [0.8, 1]) lying wholly inside one 16x16 quadrant; the class is that quadrant, in
row-major order (top-left, top-right, bottom-left, bottom-right). A faithful attribution puts
most of its mass on the square, hence in that quadrant.
"""

from __future__ import annotations

import torch
from torch import nn

SIZE = 32
NOISE = 0.3
LABELS = ("top-left", "top-right", "bottom-left", "bottom-right")
LAYERS = ("features.0", "features.3", "classifier.1")


class ImageCNN(nn.Module):
    """conv-relu-pool x2 then a linear read-out; flattening keeps where the square was."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16 * 8 * 8, len(LABELS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def quadrant_mask(quadrant: int) -> torch.Tensor:
    """A bool [32, 32] mask of one quadrant (0..3, row-major)."""
    half = SIZE // 2
    mask = torch.zeros(SIZE, SIZE, dtype=torch.bool)
    r, c = divmod(quadrant, 2)
    mask[r * half : (r + 1) * half, c * half : (c + 1) * half] = True
    return mask


def make_data(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images [n, 3, 32, 32] and their quadrant classes [n] (uniform over the four)."""
    half = SIZE // 2
    x = torch.rand(n, 3, SIZE, SIZE, generator=generator) * NOISE
    y = torch.randint(0, len(LABELS), (n,), generator=generator)
    side = torch.randint(4, 9, (n,), generator=generator)
    # position of the square's corner inside its quadrant, drawn so the square fits
    u = torch.rand(n, 2, generator=generator)
    colour = 0.8 + 0.2 * torch.rand(n, 3, generator=generator)
    for i in range(n):  # data generation only: a handful of thousand images, once
        s = int(side[i])
        r0 = int(u[i, 0] * (half - s + 1)) + (int(y[i]) // 2) * half
        c0 = int(u[i, 1] * (half - s + 1)) + (int(y[i]) % 2) * half
        x[i, :, r0 : r0 + s, c0 : c0 + s] = colour[i].view(3, 1, 1)
    return x, y


def squares_in(quadrant: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` images of the data set whose square lies in ``quadrant``."""
    found: list[torch.Tensor] = []
    while len(found) < n:
        x, y = make_data(64, generator)
        found += [xi for xi, yi in zip(x, y, strict=True) if int(yi) == quadrant]
    return torch.stack(found[:n])


def dim_noise(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` images of the background alone: dim noise, no square."""
    return torch.rand(n, 3, SIZE, SIZE, generator=generator) * NOISE


#: random sets the TCAV demo compares against
N_RANDOM = 6
#: the TCAV demo's set names (``concept_sets``' keys)
CONCEPT_NAMES = ("bright-top-left", "dim-noise", *(f"random-{i}" for i in range(N_RANDOM)))


def concept_sets() -> dict[str, torch.Tensor]:
    """The TCAV demo's example sets (30 images each), stored for ``image-cnn`` when a server
    starts: ``bright-top-left`` (a concept the top-left class leans on), ``dim-noise`` (drawn
    as the random sets are: a concept it cannot lean on), and ``random-0`` ...
    ``random-5``."""
    g = torch.Generator().manual_seed(100)
    first = [squares_in(0, 30, g), dim_noise(30, g)]
    return dict(
        zip(CONCEPT_NAMES, first + [dim_noise(30, g) for _ in range(N_RANDOM)], strict=True)
    )
