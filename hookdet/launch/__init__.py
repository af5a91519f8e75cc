"""How hookdet's processes end, told as records: :mod:`hookdet.launch.outcome`.

Starting processes (cold, warm, a script, torchrun's ranks) is still done where each kind is
(:mod:`hookdet.search.warm_start`, :mod:`hookdet.search.warm_script`,
:mod:`hookdet.distributed.launcher`); what comes back from each is one record, read here.
"""
