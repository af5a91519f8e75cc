"""Run ``hookdet run`` (2 slots) under a child subreaper, SIGKILL it as its ranks start, and
report how long the orphaned processes live on: ``{"seconds": ...}`` or ``{"left": [pids]}``.

A desktop ``systemd --user`` session is such a subreaper: an orphan is adopted by it, not by
init, so a rank that watches for ``getppid() == 1`` never notices its launcher died. Used by
``test_launcher.py``: ``python subreaper_launch.py CONFIG RUN_DIR MODEL_DIR``.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
#: How long the orphans get to end before they count as left behind.
DEADLINE = 60


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                pass
    return found


def ranks_below(pid):
    """The launched ranks below ``pid``: grandchildren through torchrun."""
    return [rank for child in children_of(pid) for rank in children_of(child)]


def main(config, run_dir, model_dir):
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hookdet", "run", config, "--run-dir", run_dir, "--model-dir", model_dir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    started = time.monotonic()
    while len(ranks_below(launcher.pid)) < 2:  # the moment both rank processes exist
        if launcher.poll() is not None or time.monotonic() - started > 240:
            print(json.dumps({"error": "the ranks never started", "status": launcher.poll()}))
            return
        time.sleep(0.005)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    killed = time.monotonic()
    while True:  # adopted orphans are this process's children now: reap them as they end
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            print(json.dumps({"seconds": time.monotonic() - killed}))
            return
        if pid == 0:
            if time.monotonic() - killed > DEADLINE:
                left = children_of(os.getpid())
                for orphan in left:
                    os.kill(orphan, signal.SIGKILL)
                print(json.dumps({"left": left}))
                return
            time.sleep(0.05)


if __name__ == "__main__":
    main(*sys.argv[1:])
