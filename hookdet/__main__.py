"""``python -m hookdet``: the ``hookdet`` command."""
import sys

from hookdet.cli.commands import main

sys.exit(main())
