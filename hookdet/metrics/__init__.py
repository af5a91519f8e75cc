"""Metrics: from what ``train_batch`` returns to what reports, callbacks and searchers receive.

``reducers`` (``MetricReducer`` and the registry), ``workload_metrics`` (averages of a workload,
reductions of a validation), ``callback_metrics`` (Determined's types for callbacks),
``metric_values`` (host copies, JSON checks) and ``live_view`` (the progress display).
"""
