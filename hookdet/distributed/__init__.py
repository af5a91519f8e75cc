"""Many processes: the distributed context the run trains with, and the launch of its ranks.

``context`` (``DistributedContext`` and its torch and Horovod kinds), ``launcher`` (torchrun and
horovodrun commands, no orphans, one voice) and ``rank_entry`` (the program each rank starts as).
"""
