"""A GAN on 28x28 digits: two models, two optimizers, stepped in the order the trial chooses.

Determined's PyTorch API has no single "the model": a trial wraps as many models, optimizers and
LR schedulers as it needs in ``__init__`` and decides in ``train_batch`` which forward and
backward passes to run and which optimizer to step when. Here each batch:

1. generates a batch of fakes from Gaussian noise;
2. trains the discriminator to tell the real batch (target 1) from the fakes (target 0); the
   fakes are detached, so this loss never reaches the generator;
3. trains the generator to make the discriminator answer 1 for its fakes. That backward pass
   also leaves gradients on the discriminator's parameters, which the next discriminator step
   must not see, so they are cleared.

``context.step_optimizer`` zeroes only the gradients of the optimizer it steps, which is why step 3
clears the discriminator's own. The noise comes from the global torch RNG; hookdet checkpoints
every RNG state, so a resumed run draws exactly the noise the uninterrupted run would have.

Validation scores the discriminator on the real validation digits and on as many fakes drawn
from a fixed-seed generator (the same fakes-from-noise every validation), so validation never
consumes the training RNG and its numbers are comparable across validations.
"""
from typing import Any, Dict

import torch
from torch import nn

import data
from hookdet import pytorch


class Generator(nn.Module):
    """Noise ``(N, latent_dim)`` -> image ``(N, 1, 28, 28)`` in [-1, 1]: 7x7 -> 14x14 -> 28x28."""

    def __init__(self, latent_dim: int, width: int) -> None:
        super().__init__()
        self.width = width
        features = 2 * width * 7 * 7
        self.project = nn.Sequential(nn.Linear(latent_dim, features), nn.BatchNorm1d(features), nn.ReLU())
        self.upsample = nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, kernel_size=4, stride=2, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.ConvTranspose2d(width, 1, kernel_size=4, stride=2, padding=1),
            nn.Tanh(),
        )

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.upsample(self.project(noise).view(-1, 2 * self.width, 7, 7))


def build_discriminator(width: int) -> nn.Module:
    """Image ``(N, 1, 28, 28)`` -> one logit per image (real > 0 > fake)."""
    return nn.Sequential(
        nn.Conv2d(1, width, kernel_size=4, stride=2, padding=1),  # 28 -> 14
        nn.LeakyReLU(0.2),
        nn.Conv2d(width, 2 * width, kernel_size=4, stride=2, padding=1),  # 14 -> 7
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        nn.Linear(2 * width * 7 * 7, 1),
    )


class GANTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.latent_dim = self.context.get_hparam("latent_dim")
        width = self.context.get_hparam("width")
        self.generator = self.context.wrap_model(Generator(self.latent_dim, width))
        self.discriminator = self.context.wrap_model(build_discriminator(width))
        betas = (self.context.get_hparam("beta1"), self.context.get_hparam("beta2"))
        self.opt_g = self.context.wrap_optimizer(
            torch.optim.Adam(self.generator.parameters(), lr=self.context.get_hparam("lr_g"), betas=betas)
        )
        self.opt_d = self.context.wrap_optimizer(
            torch.optim.Adam(self.discriminator.parameters(), lr=self.context.get_hparam("lr_d"), betas=betas)
        )
        self.loss_fn = nn.BCEWithLogitsLoss()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=True),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
            drop_last=True,  # BatchNorm needs more than one image per batch
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        real, _ = batch
        count = real.size(0)
        ones = torch.ones(count, 1, device=real.device)
        zeros = torch.zeros(count, 1, device=real.device)
        fake = self.generator(torch.randn(count, self.latent_dim, device=real.device))

        # 1. The discriminator: real -> 1, fake -> 0. One forward over both halves.
        d_logits = self.discriminator(torch.cat([real, fake.detach()]))
        d_loss = self.loss_fn(d_logits, torch.cat([ones, zeros]))
        self.context.backward(d_loss)
        self.context.step_optimizer(self.opt_d)

        # 2. The generator: make the (just updated) discriminator call the fakes real.
        g_loss = self.loss_fn(self.discriminator(fake), ones)
        self.context.backward(g_loss)
        self.context.step_optimizer(self.opt_g)
        # g_loss also put gradients on the discriminator; its next step must start from zero.
        self.opt_d.zero_grad()

        with torch.no_grad():
            d_real = torch.sigmoid(d_logits[:count]).mean()
            d_fake = torch.sigmoid(d_logits[count:]).mean()
        return {"d_loss": d_loss, "g_loss": g_loss, "d_real": d_real, "d_fake": d_fake}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        real, _ = batch
        count = real.size(0)
        noise = torch.randn(count, self.latent_dim, generator=torch.Generator().manual_seed(batch_idx))
        fake = self.generator(noise.to(real.device))
        real_logits, fake_logits = self.discriminator(real), self.discriminator(fake)
        ones = torch.ones(count, 1, device=real.device)
        zeros = torch.zeros(count, 1, device=real.device)
        return {
            "validation_loss": (self.loss_fn(real_logits, ones) + self.loss_fn(fake_logits, zeros)) / 2,
            "g_loss": self.loss_fn(fake_logits, ones),
            "d_real_accuracy": (real_logits > 0).float().mean(),
            "d_fake_accuracy": (fake_logits < 0).float().mean(),
        }
