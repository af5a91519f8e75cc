"""The program a launcher (torchrun, horovodrun) starts each rank of ``hookdet run`` with.

torchrun runs this file by its path (:data:`hookdet.distributed.launcher.RANK_ENTRY`). Its first act, before
torch is imported, is to ask the kernel to end this rank when the launcher dies
(:func:`hookdet.launch.orphans.die_with_launcher`); then it runs ``hookdet run``'s command line as the
rank. It sits above the command line in the import layers: nothing imports it.
"""

if __name__ == "__main__":
    import os
    import sys

    # the checkout (or site-packages) that holds hookdet, not this folder: import hookdet, not its modules
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    from hookdet.launch.orphans import die_with_launcher

    die_with_launcher()

    from hookdet.cli.commands import main

    sys.exit(main(sys.argv[1:]))
