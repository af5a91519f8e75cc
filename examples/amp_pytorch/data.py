"""MNIST-shaped data without a download: scikit-learn's 8x8 digits, upsampled to 1x28x28.

Determined's MNIST tutorial downloads the 60,000 MNIST images; this example trains on the 1,797
handwritten digits that ship inside scikit-learn instead, resized to MNIST's 28x28 with bilinear
interpolation and normalised with MNIST's usual mean and standard deviation, so the model code is
the same as it would be for the real thing and nothing leaves the machine.
"""
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

IMAGE_SIZE = 28
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
VALIDATION_FRACTION = 0.2


def get_dataset(train: bool) -> torch.utils.data.TensorDataset:
    """The training or validation split as ``(1x28x28 float image, int64 label)`` pairs.

    The split is a fixed permutation (its own generator, seed 0), so it is the same in every
    process of a distributed run and on every resume, and it never touches the global RNG.
    """
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    images = (images - MNIST_MEAN) / MNIST_STD
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(len(labels) * (1 - VALIDATION_FRACTION))
    chosen = order[:cut] if train else order[cut:]
    return torch.utils.data.TensorDataset(images[chosen], labels[chosen])
