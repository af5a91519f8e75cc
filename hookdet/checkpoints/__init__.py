"""The checkpoint: one package owns everything about it.

- :mod:`.format` — the directory's layout, the manifest, verification, weights-only loading;
  :mod:`.determined_format` reads checkpoints Determined 0.38 wrote.
- :mod:`.writer` — the background writer and the host snapshot it writes from.
- :mod:`.lookup` — finding checkpoints on disk, the newest intact one; :mod:`.user_index` —
  every local run's checkpoints by id (Determined's per-user store).
- :mod:`.storage` — the storage protocol every storage answers; :mod:`.registry` — storage
  types by ``checkpoint_storage.type`` (entry points); the built-in types :mod:`.local`
  (``shared_fs``, ``directory``, the default), :mod:`.s3`, :mod:`.gcs`, :mod:`.azure` (the
  last three on :mod:`.object_store`); :mod:`.os_errors` — failures in words.
- :mod:`.api` — checkpoints outside training: ``load_trial_from_checkpoint_path``, export.

When and how often to write, retention and the callbacks' order are the ``checkpoint``
plugin's (:mod:`hookdet.plugins.builtin.checkpoint`); the run that writes them is
:mod:`hookdet.runs`'s.
"""
