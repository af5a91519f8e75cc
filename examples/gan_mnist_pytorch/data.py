"""MNIST-shaped images without a download: scikit-learn's 8x8 digits, upsampled to 1x28x28.

The GAN learns to draw the 1,797 handwritten digits that ship inside scikit-learn, resized to
MNIST's 28x28 with bilinear interpolation and scaled to [-1, 1], the range of the generator's
``tanh`` output. Labels are kept (the loader yields ``(image, label)`` like torchvision's MNIST)
but the GAN ignores them.
"""
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

IMAGE_SIZE = 28
VALIDATION_FRACTION = 0.2


def get_dataset(train: bool) -> torch.utils.data.TensorDataset:
    """The training or validation split as ``(1x28x28 image in [-1, 1], int64 label)`` pairs.

    The split is a fixed permutation (its own generator, seed 0), so it is the same in every
    process of a distributed run and on every resume, and it never touches the global RNG.
    """
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    images = images.clamp(0.0, 1.0) * 2.0 - 1.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(len(labels) * (1 - VALIDATION_FRACTION))
    chosen = order[:cut] if train else order[cut:]
    return torch.utils.data.TensorDataset(images[chosen], labels[chosen])
