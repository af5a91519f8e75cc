"""CIFAR-10-shaped data made on the spot: 3x32x32 colour images in 10 classes, no download.

Each class is a colour grating: a class colour (drawn once from a fixed palette) modulating a
sinusoidal stripe pattern with one of five orientations and one of two frequencies. Every image
gets a random phase (the stripes shift, as a random crop would shift real objects), a random
brightness and per-pixel Gaussian noise, so a model has to learn orientation, frequency and
colour with convolutions rather than memorise pixels. Values are in [0, 1] before the usual CIFAR normalisation
``(x - 0.5) / 0.5``: the tensors torchvision's CIFAR10 + ``Normalize`` would hand a trial.

All randomness comes from private ``torch.Generator`` objects with fixed seeds: the same split in
every process and on every resume, and the global RNG (which dropout uses) is never touched.
"""
import math

import torch

IMAGE_SIZE = 32
NUM_CHANNELS = 3
NUM_CLASSES = 10
PALETTE_SEED = 1234


def class_palette() -> torch.Tensor:
    """One RGB colour per class, shape ``(10, 3)``, bright enough to see."""
    generator = torch.Generator().manual_seed(PALETTE_SEED)
    return 0.3 + 0.7 * torch.rand(NUM_CLASSES, NUM_CHANNELS, generator=generator)


def make_images(count: int, seed: int, noise: float = 0.15) -> torch.utils.data.TensorDataset:
    """``count`` images with labels, drawn from generator ``seed`` (use different seeds per split)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (count,), generator=generator)
    coordinates = torch.arange(IMAGE_SIZE, dtype=torch.float32) / IMAGE_SIZE
    rows, columns = torch.meshgrid(coordinates, coordinates, indexing="ij")
    angle = (labels % 5).float() * (math.pi / 5)
    frequency = 1.5 + 1.5 * (labels // 5).float()
    phase = 2 * math.pi * torch.rand(count, generator=generator)
    along = columns * torch.cos(angle)[:, None, None] + rows * torch.sin(angle)[:, None, None]
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * frequency[:, None, None] * along + phase[:, None, None])
    brightness = 0.7 + 0.3 * torch.rand(count, 1, 1, 1, generator=generator)
    images = class_palette()[labels][:, :, None, None] * stripes[:, None] * brightness
    images = images + noise * torch.randn(images.shape, generator=generator)
    images = (images.clamp(0.0, 1.0) - 0.5) / 0.5
    return torch.utils.data.TensorDataset(images, labels)


def get_dataset(train: bool, records: int) -> torch.utils.data.TensorDataset:
    """The training split (seed 1) or validation split (seed 2), ``records`` images long."""
    return make_images(records, seed=1 if train else 2)
