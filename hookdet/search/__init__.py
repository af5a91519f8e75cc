"""Hyperparameter search: Determined's spaces and searchers, run as ordinary hookdet runs.

:mod:`~hookdet.search.space` (sampling, grids, the master's random stream) and
:mod:`~hookdet.search.methods` (the searchers' decision rules) need nothing beyond numpy; running
a search (:mod:`~hookdet.search.driver`) needs the ``search`` extra (Optuna, matplotlib).
"""
