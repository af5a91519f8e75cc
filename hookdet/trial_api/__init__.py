"""The trial API, bottom layer: what a Determined trial is written against.

``trial`` (``PyTorchTrial``, ``PyTorchCallback``, ``Batch``/``Epoch``), ``context`` (the trial
context and its experimental half), ``lr_scheduler``, ``mixed_precision`` (autocast helpers the
context and mixed-precision plugins share), ``rng`` (seeding and RNG state), ``cluster_info``
(``det.get_cluster_info()``) and ``importing`` (``module:Class`` specs). The public names are
re-exported by :mod:`hookdet.pytorch`.
"""
