"""Installing a third-party package the tests ship (``tests/fixtures/hookdet-*``) as a user would:
by pip, from a copy of its source, into a folder of its own."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def pip_install(package: Path, work: Path) -> Path:
    """``pip install`` of ``package`` (copied first: pip's build writes into the source tree) into
    ``work/site``, without dependencies or the index; the folder, for ``PYTHONPATH``."""
    source = work / "source"
    shutil.copytree(package, source)
    site = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True,
    )
    return site
