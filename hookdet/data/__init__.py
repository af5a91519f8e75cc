"""Data: Determined's ``DataLoader`` and how hookdet feeds batches to the loop.

``loader`` (``pytorch.DataLoader``), ``loader_adapters`` (sharding, skipping and repeating a
loader for exact resume), ``samplers`` (Determined's samplers) and ``batch_moving``
(``to_device``, ``data_length``).
"""
