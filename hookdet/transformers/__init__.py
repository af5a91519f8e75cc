"""``det.transformers``: Determined's Hugging Face ``Trainer`` callback, ``DetCallback``.

Re-exports only; the callback lives in :mod:`hookdet.transformers.callback`. It needs the
``transformers`` extra (``pip install 'hookdet[transformers]'``).
"""
from hookdet.transformers.callback import DetCallback

__all__ = ["DetCallback"]
