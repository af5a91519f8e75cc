"""``python -m hookdet``: the ``hookdet`` command."""
import sys

from hookdet.cli import main

sys.exit(main())
