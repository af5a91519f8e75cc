"""The names of a run directory's files: one table, so every reader and writer agrees.

::

    <run dir>/
      run.json            RUN_RECORD_FILE  state, pid and host, times, how it ended (record.py)
      config.json         CONFIG_FILE      the experiment as it ran
      metrics.jsonl       METRICS_FILE     every training and validation report (metrics.py)
      metrics-summary.json METRICS_SUMMARY_FILE  what metrics.jsonl holds, in brief, kept current as it is written (metrics.py)
      history.jsonl       HISTORY_FILE     each start, resume and end, with what changed (record.py)
      run_identity.json   IDENTITY_FILE    the run id and where its checkpoints are (identity.py; read by checkpoints/resolver.py)
      .hookdet.lock       LOCK_FILE        who holds the run (lock.py)
      .writes-in-progress/ WRITES_IN_PROGRESS_DIR  a note per checkpoint being written (lock.py)
      checkpoints/        CHECKPOINTS_DIR  the default checkpoint storage
      tensorboard/        TENSORBOARD_DIR  the tensorboard plugin's event files
      logs/               LOGS_DIR         what each rank printed (the run_log plugin; runs/logs.py reads it)
"""
from hookdet.checkpoints import storage

RUN_RECORD_FILE = "run.json"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
METRICS_SUMMARY_FILE = "metrics-summary.json"
HISTORY_FILE = "history.jsonl"
IDENTITY_FILE = storage.IDENTITY_FILE  # read by checkpoints/resolver.py, written by identity.py
LOCK_FILE = ".hookdet.lock"
WRITES_IN_PROGRESS_DIR = ".writes-in-progress"
CHECKPOINTS_DIR = storage.CHECKPOINTS_DIR  # the default storage's, named where it is made
TENSORBOARD_DIR = "tensorboard"
LOGS_DIR = "logs"
