"""The run directory as the host's record of a run: one package reads and writes it.

- :mod:`.files` — the names of its files, in one table.
- :mod:`.record` — ``run.json`` and ``config.json``: state, how it ended, the experiment.
- :mod:`.metrics` — ``metrics.jsonl``: every report, written by the host.
- :mod:`.identity` — ``run_identity.json``: the run id and its storage's locator; finding the
  run's checkpoints wherever they are.
- :mod:`.lock`, :mod:`.ownership` — one owner per run directory.
- :mod:`.index`, :mod:`.plot`, :mod:`.resume_report` — ``runs``/``show``/``compare``/``plot``,
  and what a resume changed.
"""
