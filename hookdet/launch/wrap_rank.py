"""``python3 -m hookdet.launch.wrap_rank RANK -- COMMAND...``: a worker's output, marked with its rank.

Determined's ``determined.launch.wrap_rank`` for the workers a script starts itself (the Core
API tutorial's stage 4): it runs COMMAND and prefixes each line COMMAND writes to standard
output or error with ``[rank=RANK] ``, on the same stream, so the lines of many workers sharing
one terminal or log can be told apart (and filtered, as ``hookdet logs --rank`` filters a run's
own rank logs). A line ends at ``\\n`` or ``\\r`` (a progress bar's redraw is a line). SIGTERM,
SIGINT and SIGHUP are passed on to COMMAND (which runs in a session of its own, so a signal
to the whole process group reaches it once) and COMMAND gets SIGTERM if this process dies; the exit status is COMMAND's (128 + N when a signal
N killed it). ``--no-redirect-stdio`` is accepted for Determined's signature (output always
stays on its own stream here).
"""
from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
from typing import BinaryIO, List, Optional

from hookdet.launch.orphans import set_parent_death_signal

#: Where a line ends: a newline or a carriage return.
_LINE_END = re.compile(rb"[\r\n]")


def prefix_lines(source: BinaryIO, target: BinaryIO, prefix: bytes) -> None:
    """Copy ``source`` to ``target`` line by line, each line prefixed, each ending in ``\\n``."""
    pending = b""
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
        if not chunk:
            break
        pending += chunk
        while True:
            found = _LINE_END.search(pending)
            if found is None:
                break
            target.write(prefix + pending[:found.start()] + b"\n")
            pending = pending[found.end():]
        target.flush()
    if pending:
        target.write(prefix + pending + b"\n")
        target.flush()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hookdet.launch.wrap_rank",
                                     description="run a command, each line of its output marked with its rank")
    parser.add_argument("rank", help="the rank to mark lines with")
    parser.add_argument("--no-redirect-stdio", action="store_true", help="accepted for Determined's signature")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run (python3 -m hookdet.launch.wrap_rank RANK -- COMMAND...)")
    prefix = f"[rank={args.rank}] ".encode()
    # A session of its own, so a signal to this process's group reaches COMMAND once (passed on
    # here), not twice (a second SIGINT interrupts at once); SIGTERM if this process dies.
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    copiers = [threading.Thread(target=prefix_lines, args=(stream, target, prefix), daemon=True)
               for stream, target in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer))]
    for copier in copiers:
        copier.start()
    status = child.wait()
    for copier in copiers:
        copier.join()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
