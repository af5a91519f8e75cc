"""The global random generators a run seeds and a checkpoint carries: Python's, NumPy's, torch's
(CUDA's included). Seeded once from the trial seed at the start of a run
(:func:`seed_everything`); captured per rank into every checkpoint as tensors and plain values a
``weights_only`` load accepts (:func:`capture_rng_state`), and restored on resume
(:func:`restore_rng_state`), so dropout and augmentation in the main process continue exactly.
"""
from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CUDA's included)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> Dict[str, Any]:
    """This process's RNG states as tensors and plain values (loadable with weights_only)."""
    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        "python": [version, list(python_state), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype("int64")), int(position), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured."""
    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
