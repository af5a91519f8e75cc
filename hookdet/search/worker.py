"""A search worker: claims segments from the queue and trains each with an ordinary ``hookdet run``.

A segment runs ``hookdet run SEGMENT_CONFIG --run-dir TRIAL_DIR`` (``--resume TRIAL_DIR`` when
the trial already has a checkpoint) in a process of its own, forked from a process that has
already imported torch and hookdet (:mod:`hookdet.search.warm_start`), so any trial ``hookdet run``
accepts can be searched, with its hyperparameters in the config and its seed in
``HOOKDET_TRIAL_SEED``. Before a resume the trial's ``metrics.jsonl`` is cut back to the
checkpoint's step, so a segment that died after its last checkpoint leaves no duplicate lines.

Workers started by the driver (``--workers N``) are threads of it; ``hookdet search worker``
runs the same loop in a process of its own, on this machine or another one that sees the search
directory and the store. With ``--work-dir`` a worker shares nothing but the store (and the
checkpoint storage, e.g. S3): it writes each segment's experiment file (carried in the store)
and the trial's run directory into its own directory, gives the run directory the trial's
identity (its run id and checkpoint storage, carried in the store too), and so resumes a trial
from the newest checkpoint in that storage, whichever worker wrote it.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hookdet.config.experiment import SEARCH_STOP_FILE_ENV, SEGMENT_END_ENV, TRIAL_ID_ENV, TRIAL_SEED_ENV
from hookdet.exit_codes import BAD_INPUT_EXIT_CODE, INVALID_HP_EXIT_CODE, PREEMPTED_EXIT_CODE
from hookdet.checkpoints.resolver import newest_checkpoint_steps, read_identity
from hookdet.distributed.launcher import CRASH_SIGNALS, signal_name
from hookdet.launch.outcome import OUTCOME_FILE_ENV, Outcome
from hookdet.launch.outcome import read as read_outcome
from hookdet.launch.start import Job, Started
from hookdet.runs.identity import adopt_identity
from hookdet.runs.metrics import drop_reports_after, read_reports
from hookdet.runs.lock import RunDirLock
from hookdet.runs.record import forget_attempt
from hookdet.search.live_trial import LIVE, LiveRelay, stop_file
from hookdet.search.store import BEAT_SECONDS, Queue, StoreError, attrs_of
from hookdet.search.warm_pool import WarmPool
from hookdet.search.warm_start import torch_gpu_count

logger = logging.getLogger("hookdet")
#: Seconds between a separate worker's progress lines while a segment trains.
PROGRESS_EVERY_S = 30.0
#: Seconds between two looks at a training Core API trial's validations and stop.
LIVE_POLL_S = 0.5
#: Seconds between two looks at a run directory another process holds (:meth:`SegmentRunner._wait_for_run_dir`).
WAIT_FOR_RUN_DIR_S = 0.5
#: ``hookdet run``'s exit statuses a worker tells apart.
PREEMPTED, INVALID_HP, BAD_INPUT = PREEMPTED_EXIT_CODE, INVALID_HP_EXIT_CODE, BAD_INPUT_EXIT_CODE


def validations(run_dir: Path, metric: str) -> List[List[float]]:
    """``[[batches, value], ...]`` of every validation of ``metric`` in the trial's reports."""
    return [
        [report["steps_completed"], float(report["metrics"][metric])]
        for report in read_reports(run_dir)
        if report.get("group") == "validation" and metric in report["metrics"]
    ]


def latest_batch(run_dir: Path) -> Optional[int]:
    """The batch of the trial's newest report, from the end of its ``metrics.jsonl`` alone."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as handle:
            handle.seek(max(path.stat().st_size - 4096, 0))
            tail = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        try:
            return int(json.loads(line)["steps_completed"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def outcome_file(run_dir: Path) -> Path:
    """Where a segment's ``hookdet run`` writes how it ended (:mod:`hookdet.launch.outcome`),
    beside its log; read, and removed, once it exited."""
    return run_dir.parent / f".{run_dir.name}.outcome.json"


class Slot:
    """One worker's share of the machine: CPU cores and threads, GPUs. The thread count is the
    user's ``OMP_NUM_THREADS`` when set (a 2-core machine running one worker with
    ``OMP_NUM_THREADS=1`` trains each trial on one thread, as ``hookdet run`` would), else the
    slot's cores shared among the trial's ranks."""

    def __init__(self, index: int, count: int, slots_per_trial: int = 1, pool: Optional[WarmPool] = None) -> None:
        self.pool = pool  # which asks the warm process how many GPUs torch sees
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        share = max(len(cores) // max(count, 1), 1)
        self.cpus = cores[index * share:(index + 1) * share] if len(cores) >= count else cores
        self.threads = users_thread_count() or max(len(self.cpus) // max(slots_per_trial, 1), 1)
        self.index, self.slots_per_trial = index, slots_per_trial

    @functools.cached_property
    def gpus(self) -> Optional[List[int]]:
        """This slot's GPUs (None for none), found when its first segment starts."""
        visible = visible_gpus(self.pool)
        first = self.index * self.slots_per_trial
        return visible[first:first + self.slots_per_trial] or None

    def env(self) -> Dict[str, str]:
        env = {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS")
               or str(self.threads)}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in self.gpus)
        return env

    def describe(self) -> Dict[str, Any]:
        return {"cpus": self.cpus, "threads": self.threads, "gpus": self.gpus}


def users_thread_count() -> Optional[int]:
    """``OMP_NUM_THREADS`` of this process's environment when it is a positive number."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def visible_gpus(pool: Optional[WarmPool] = None) -> List[int]:
    """``CUDA_VISIBLE_DEVICES`` when set, else every GPU torch sees (asked of ``pool``'s warm
    process, without importing torch here: :meth:`WarmPool.gpu_count`; here without one)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [int(x) for x in listed.split(",") if x.strip().isdigit()]
    return list(range(pool.gpu_count() if pool is not None else torch_gpu_count()))


class SegmentRunner:
    """Runs segments for one worker, started from ``pool`` (its process's warm process);
    :meth:`terminate` preempts the running one. ``work_dir`` (and ``model_dir``): a worker of
    its own directory (see the module's docstring)."""

    def __init__(self, queue: Queue, slot: Slot, pool: WarmPool, work_dir: Optional[Path] = None,
                 model_dir: Optional[Path] = None) -> None:
        self.queue, self.slot, self.pool = queue, slot, pool
        self.work_dir, self.model_dir = work_dir, model_dir
        self.process: Optional[Started] = None
        self._lock = threading.Lock()
        self.stopping = False
        self._waiting = False  # in work(), between a claim that found nothing and the next
        self._handed: Optional[Any] = None  # a segment the driver claimed for this runner
        #: Where a separate worker says which trial it trains and how far it got (the driver's
        #: own workers say nothing: its decision lines do).
        self.say: Optional[Callable[[str], None]] = None

    def place(self, attrs: Dict[str, Any]) -> Tuple[Path, str, str]:
        """(run directory, experiment file, model directory) of a segment on this worker: the
        search directory's, or with a work directory its own copies there."""
        model_dir = str(self.model_dir or attrs["model_dir"])
        if self.work_dir is None:
            run_dir, config = Path(attrs["run_dir"]), attrs["config"]
            search_dir = self.queue.info().get("search_dir")
            if search_dir and run_dir.parent != Path(search_dir):  # queued before the search moved
                if Path(model_dir).is_relative_to(run_dir.parent):  # its snapshot moved with it
                    model_dir = str(Path(search_dir) / Path(model_dir).relative_to(run_dir.parent))
                run_dir = Path(search_dir) / run_dir.name
                config = str(run_dir / Path(config).name)
            return run_dir, config, model_dir
        run_dir = self.work_dir / Path(attrs["run_dir"]).name
        run_dir.mkdir(parents=True, exist_ok=True)
        if attrs.get("identity") and read_identity(run_dir) is None:
            adopt_identity(run_dir, attrs["identity"])
        config = self.work_dir / f"{run_dir.name}-{Path(attrs['config']).name}"
        config.write_text(json.dumps(attrs["experiment"], indent=1))
        return run_dir, str(config), model_dir

    def accepts(self) -> bool:
        """Whether this runner waits for a segment and has none handed to it yet."""
        with self._lock:
            return self._waiting and self._handed is None and not self.stopping

    def hand(self, segment: Any) -> None:
        """Give this runner a segment claimed for it (:meth:`Queue.add`, ``claimed``), and wake it."""
        with self._lock:
            self._handed = segment
        self.queue.wake()

    def take_handed(self) -> Optional[Any]:
        """The segment handed to this runner (once), or None."""
        with self._lock:
            handed, self._handed = self._handed, None
        return handed

    def wait_for_segment(self, seen: int, timeout: float) -> None:
        """Wait for the queue to change (a segment queued or handed), at most ``timeout`` s."""
        with self._lock:
            self._waiting = self._handed is None
        try:
            if self._waiting:
                self.queue.wait_for_change(seen, timeout)
        finally:
            with self._lock:
                self._waiting = False

    def terminate(self) -> None:
        with self._lock:
            self.stopping = True
            if self.process is not None:
                self.process.send_signal(signal.SIGTERM)

    def run(self, segment: Any) -> None:
        attrs = attrs_of(segment)
        trial_id = self.queue.trial_id(segment.number)
        if self.stopping:  # claimed as the search was told to stop: hand it back untouched
            self.queue.finish(trial_id, {"exit_code": PREEMPTED}, ok=False)
            return
        with Beats(self.queue, trial_id, on_lost_store=self.terminate) as beats:
            free = self._wait_for_run_dir(self.place(attrs)[0], attrs)
            if free:
                run_dir, steps, started = self._start(trial_id, attrs)
                relay = LiveRelay(self.queue, trial_id, run_dir, attrs["metric"], attrs.get("unit"))
                status = self._wait(run_dir, attrs, relay)
        if beats.failure is not None:  # the store is gone: the segment checkpointed and stopped
            raise beats.failure
        if not free:  # stopped while another process held the trial's directory: handed back untouched
            self.queue.finish(trial_id, {"exit_code": PREEMPTED}, ok=False)
            return
        self._finish(trial_id, attrs, (run_dir, steps, started, status), relay.publish())

    def _start(self, trial_id: int, attrs: Dict[str, Any]) -> Tuple[Path, Optional[int], float]:
        """Start the segment's process (resuming the trial's newest checkpoint, if any); its run
        directory, the batch it resumes at, and when it started."""
        run_dir, config, model_dir = self.place(attrs)
        steps = newest_checkpoint_steps(run_dir)
        if steps is None:
            forget_attempt(run_dir)
        else:
            drop_reports_after(run_dir, steps)
        argv = ["run", config, "--run-dir", str(run_dir), "--model-dir", model_dir]
        if steps is not None:
            argv += ["--resume", str(run_dir)]
        entrypoint = (attrs.get("experiment") or {}).get("entrypoint")
        self.pool.warm_up(Path(model_dir), entrypoint)  # before the slot's GPUs are asked of the warm process
        env = dict(os.environ, **self.slot.env())
        env.update({TRIAL_SEED_ENV: str(attrs["seed"]), TRIAL_ID_ENV: str(attrs["trial"])})
        env.pop("HOOKDET_RUN_DIR", None)
        env.pop(SEGMENT_END_ENV, None)
        if attrs.get("target"):  # else the trial trains to its own length
            env[SEGMENT_END_ENV] = f"{attrs['target']} {attrs.get('unit') or 'batches'}"
        run_dir.mkdir(parents=True, exist_ok=True)
        outcome_file(run_dir).unlink(missing_ok=True)  # a record of this segment's own, or none
        env[OUTCOME_FILE_ENV] = str(outcome_file(run_dir))
        stop_file(run_dir).unlink(missing_ok=True)  # a Core API trial's: made when the search stops it
        env[SEARCH_STOP_FILE_ENV] = str(stop_file(run_dir))
        started = time.time()
        with self._lock:
            job = Job(argv, env, model_dir, log=str(run_dir.parent / f"{run_dir.name}.log"), cpus=self.slot.cpus)
            self.process = self.pool.start_segment(job, entrypoint)
            if self.stopping:
                self.process.send_signal(signal.SIGTERM)
        target = f"to batch {attrs['target']}" if attrs.get("target") else "to its end"
        self._tell(f"worker: trial {attrs['trial']} training {target}"
                   + (f" from batch {steps}" if steps else "") + f" in {run_dir}")
        # Recorded once said: whoever sees the segment's process in the store has the line too.
        self.queue.storage.set_trial_user_attr(trial_id, "child_pid", self.process.pid)
        return run_dir, steps, started

    def _finish(self, trial_id: int, attrs: Dict[str, Any], ran: Tuple[Path, Optional[int], float, int],
                live: Optional[List[List[Any]]]) -> None:
        """Report the segment's new validations of the searcher metric and record how it ended
        (a Core API trial's ``live`` validations too: :mod:`hookdet.search.live_trial`)."""
        run_dir, steps, started, status = ran
        found = validations(run_dir, attrs["metric"])
        self._tell(f"worker: trial {attrs['trial']} ended at batch {found[-1][0] if found else '?'}"
                   + (f" ({attrs['metric']} {found[-1][1]:.4g})" if found else "")
                   + f", exit status {status}, after {time.time() - started:.1f} s")
        for batches, value in found:
            if steps is None or batches > steps:
                self.queue.report(trial_id, int(batches), value)
        # none: it died without a word, and its exit status is all there is
        said = read_outcome(outcome_file(run_dir)) or Outcome("killed" if status < 0 else "failed", status)
        outcome_file(run_dir).unlink(missing_ok=True)
        status = ended_as_recorded(status, said, attrs["trial"])
        outcome = {"exit_code": status, "state": said.state, "error": said.error, "error_by": said.error_by,
                   "checkpoint": said.checkpoint, "started": started, "ended": time.time(),
                   "resumed_at": steps, "slot": self.slot.describe(),
                   "metric": found[-1][1] if found else None,
                   "batches": found[-1][0] if found else None,
                   "identity": read_identity(run_dir),  # where any worker finds its checkpoints
                   **({LIVE: live} if live is not None else {})}
        self.queue.finish(trial_id, outcome, ok=status == 0)

    def _wait_for_run_dir(self, run_dir: Path, attrs: Dict[str, Any]) -> bool:
        """Wait while another process holds the trial's run directory: the process of a segment
        given up as lost whose machine froze past the grace period and is still there (it may
        wake and finish). The retry then continues from what it leaves, instead of being
        refused by the lock; its beats go on meanwhile. True once the directory is free; False
        when the search is stopped first."""
        lock, told = RunDirLock(run_dir), False
        while not self.stopping:
            holder = lock.held_elsewhere()
            if holder is None:
                return True
            if not told:
                self._tell(f"worker: trial {attrs['trial']} waits for its run directory, held by {holder}")
                told = True
            time.sleep(WAIT_FOR_RUN_DIR_S)
        return False

    def _tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    def _wait(self, run_dir: Path, attrs: Dict[str, Any], relay: LiveRelay) -> int:
        """The segment's exit status, once it exits; meanwhile a Core API trial's validations
        and stop are relayed (``relay``), and a separate worker says how far it got."""
        assert self.process is not None
        told, next_told = None, time.monotonic() + PROGRESS_EVERY_S
        while True:
            status = self.process.wait(timeout=LIVE_POLL_S)
            if status is not None:
                return status
            relay.poll()
            if self.say is None or time.monotonic() < next_told:
                continue
            next_told = time.monotonic() + PROGRESS_EVERY_S
            batches = latest_batch(run_dir)
            if batches is not None and batches != told:
                told = batches
                of = f" of {attrs['target']}" if attrs.get("target") else ""
                self._tell(f"worker: trial {attrs['trial']} at batch {batches}{of}")


def ended_as_recorded(status: int, said: Outcome, trial: Any) -> int:
    """The status a segment ended with: its own record's where the process crashed (SIGABRT,
    SIGSEGV, ...) after it recorded its end (a library's teardown aborting as the interpreter
    exits: its training and checkpoint are complete, and a retry would train nothing), else
    ``status``."""
    if status >= 0 or said.exit_code is None or said.signal is not None or said.state == "killed":
        return status
    crash = signal_name(-status)
    if crash not in CRASH_SIGNALS:
        return status
    logger.warning("hookdet: warning: trial %s: its process was killed by %s after it recorded its end (%s, "
                   "exit status %d): taken as it recorded", trial, crash, said.state, said.exit_code)
    return said.exit_code


class Beats:
    """A running segment's beats (:meth:`Queue.beat`, every :data:`BEAT_SECONDS`) from a thread
    of their own, from the moment its worker has it to the moment it ended: a slow start (the
    warm process still importing, a busy machine) is never silence. A lost store stops the beats,
    is kept in ``failure``, and ``on_lost_store`` is called (the worker stops its segment)."""

    def __init__(self, queue: Queue, trial_id: int, on_lost_store: Callable[[], None]) -> None:
        self.queue, self.trial_id, self.on_lost_store = queue, trial_id, on_lost_store
        self.failure: Optional[StoreError] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hookdet-beats", daemon=True)

    def __enter__(self) -> "Beats":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                self.queue.beat(self.trial_id)
            except StoreError as error:
                self.failure = error
                self.on_lost_store()
                return


def work(queue: Queue, runner: SegmentRunner, done: threading.Event, poll: float = 0.5) -> None:
    """Claim and run segments until ``done`` is set (by the driver, or the study's end). A lost
    or damaged store ends it with :class:`StoreError` (its segment stopped first)."""
    while not done.is_set() and not runner.stopping:
        seen = queue.generation()
        segment = runner.take_handed() or queue.claim()
        if segment is None:
            if queue.info().get("finished"):
                return
            runner.wait_for_segment(seen, poll)  # a segment this process queues wakes it at once
            continue
        _run_one(runner, segment)
    handed = runner.take_handed()
    if handed is not None:  # handed over as the search was told to stop: given back untouched
        _run_one(runner, handed)


def _run_one(runner: SegmentRunner, segment: Any) -> None:
    try:
        runner.run(segment)
    except StoreError:  # lost or damaged: no segment can be told or taken any more
        raise
    except Exception as error:  # the store refused an update: the driver reaped it as dead
        logger.warning("segment %s: %s: %s", attrs_of(segment).get("key"), type(error).__name__, error)


def main_worker(storage_url: str, index: int = 0, count: int = 1, study: Optional[str] = None,
                work_dir: Optional[Path] = None, model_dir: Optional[Path] = None) -> int:
    """``hookdet search worker``: join a search's store and work until the search ends."""
    queue = Queue(storage_url, study)
    pool = WarmPool()
    slot = Slot(index, count, int(queue.info().get("slots_per_trial", 1)), pool)
    runner = SegmentRunner(queue, slot, pool, work_dir and work_dir.resolve(), model_dir and model_dir.resolve())
    runner.say = lambda line: print(line, flush=True)
    done = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        runner.terminate()
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        work(queue, runner, done)
    finally:
        pool.close()
    return PREEMPTED if runner.stopping else 0
