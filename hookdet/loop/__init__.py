"""The loop: one run, from ``pytorch.init`` to the last batch.

``run`` (the ``Run`` every hook shares, ``TrainState``), ``stash`` (``run.stash``'s typed keys),
``trainer`` (``init`` and ``Trainer.fit``), ``core_loop`` (the training loop that emits the hooks),
``loop_schedule`` (when to validate, checkpoint and report), ``loop_interface`` (what the loop
asks of the context) and ``active_run`` (the run of this process).
"""
