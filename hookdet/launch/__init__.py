"""Starting processes and learning how they ended: one way to start any of them
(:mod:`hookdet.launch.start`), one record of how each ended (:mod:`hookdet.launch.outcome`), and
the rule that none outlives the process that started it (:mod:`hookdet.launch.orphans`).

What a process *is* stays where its kind is: a warm segment in :mod:`hookdet.search.warm_start`,
a forked script in :mod:`hookdet.search.warm_script`, torchrun's ranks in
:mod:`hookdet.distributed.launcher`. docs/process-outcome.md describes the record as a format.
"""
