"""The search driver: the one process that takes the searcher's decisions.

It owns Determined's search method (:mod:`hookdet.search.methods`) and the master's random
stream, turns their actions into segments on the queue (:mod:`hookdet.search.store`), and feeds
each finished segment back as Determined's experiment would (validation, early exit, exit).

Its state (method state, generator state, trials, which segments it has taken decisions on, and
segments decided but not yet queued) is saved atomically to ``search-state.json`` after every
decision and before the segments it decided are queued (each has a key, so queueing twice is a
no-op). So a driver killed at any moment resumes (``hookdet run CONFIG --resume SEARCH_DIR``)
without taking a decision twice or losing one.

Outcomes do not depend on timing. Each segment gets a sequence number when it is decided (a retry
of a segment, after a kill or a crash, keeps its number); workers claim the lowest number first,
and the driver takes decisions on finished segments strictly in number order, waiting for an
earlier segment however long a later one has been done. Numbers are handed out only by
decisions, so the whole history of decisions is a function of the segments' results alone:
the same trials stop at the same lengths with 1 worker or N, and after any number of kills.
A Core API trial, decided while it trains, keeps that order too (:mod:`hookdet.search.live_trial`).

Why one long module: the driver is one state machine, whose decisions, their order and what it
saves must be read together; what only Core API trials need lives in ``live_trial``.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.search import live_trial, methods
from hookdet.search.report import STATE_FILE, recorded_dir, trial_dir
from hookdet.search.settings import SearchSettings
from hookdet.search.live_view import SearchView, best_words, decision_line
from hookdet.search.space import MasterRandom
from hookdet.search.trial_view import TrialView
from hookdet.search.warm_pool import WarmPool
from hookdet.search.store import BEAT_SECONDS, Queue, StoreError, attrs_of, grace_seconds, worker_id
from hookdet.search.worker import BAD_INPUT, INVALID_HP, PREEMPTED, SegmentRunner, Slot, work

logger = logging.getLogger("hookdet")


def _pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_view(queue: Queue, space: Dict[str, Any], metric: str) -> Optional[TrialView]:
    """The search's one-Optuna-trial-per-trial study (:mod:`.trial_view`), or None where the
    store will not take it (said once; the search does not need it)."""
    try:
        return TrialView(queue, space, metric)
    except Exception as error:  # noqa: BLE001 - each store backend has its own errors
        logger.warning("hookdet: warning: no trial view of the search in its store: %s", error)
        return None


class Driver:
    def __init__(self, search_dir: Path, settings: SearchSettings, space: Dict[str, Any],
                 raw_config: Dict[str, Any], model_dir: Path, queue: Queue,
                 experiment_seed: int, pool: WarmPool) -> None:
        self.search_dir, self.settings, self.space = Path(search_dir), settings, space
        self.raw_config, self.model_dir, self.queue = raw_config, Path(model_dir), queue
        self.pool = pool  # the warm process this process's local workers start their segments from
        self.view = open_view(queue, space, settings.metric)
        self.live: Optional[SearchView] = None  # the terminal's view, while run() runs in one
        self.segments_seen: List[Any] = []  # what the last poll read of the store
        self.queued: Optional[set] = None  # the keys of the segments in the store
        self.method = settings.build(space)
        self.rand = MasterRandom(experiment_seed)
        self.ctx = methods.Context(self.rand, space)
        self.state: Dict[str, Any] = {"trials": {}, "order": [], "processed": [], "pending": [],
                                      "finished": False, "next_seq": 1}
        self.stopping = False
        self.ended = False  # the loop saw the search end: a SIGTERM from now on changes nothing
        self.runners: List[SegmentRunner] = []
        self.store_failure: Optional[StoreError] = None
        # When this process began driving, and the batches trained by then: its pace, for the ETA.
        self.started_at, self.batches_at_start = time.monotonic(), 0
        self._reaped_at = float("-inf")  # when reap_stale last asked the store

    # ------------------------------------------------------------------------------ state

    @property
    def state_path(self) -> Path:
        return self.search_dir / STATE_FILE

    def save(self) -> None:
        """The state, replaced whole; trial directories recorded relative to the search directory."""
        trials = {rid: dict(trial, dir=recorded_dir(self.search_dir, trial["dir"]))
                  for rid, trial in self.state["trials"].items()}
        saved = dict(self.state, trials=trials, rand=self.rand.get_state(), method=self.method.state)
        partial = self.state_path.with_name(f".{STATE_FILE}.partial")
        partial.write_text(json.dumps(saved))
        os.replace(partial, self.state_path)

    def load(self, moved_from: Optional[str] = None) -> None:
        """Read the saved state; ``moved_from``: the directory the search was in when it was
        saved (a copied or moved search), whose trial directories become this one's."""
        try:
            saved = json.loads(self.state_path.read_text())
            rand_state, method_state = saved.pop("rand"), saved.pop("method")
        except (ValueError, KeyError, AttributeError, TypeError, OSError) as error:
            raise StoreError(
                f"{self.state_path}: not a search state hookdet wrote ({type(error).__name__}: "
                f"{error}); it is replaced whole at each decision, so it was changed by something "
                "else, or the disk failed"
            ) from None
        self.rand.set_state(rand_state)
        if hasattr(self.method, "load_state"):
            self.method.load_state(method_state)
        else:
            self.method.state = method_state
        for trial in saved["trials"].values():
            trial["dir"] = str(trial_dir(self.search_dir, trial["dir"]))
        self.state = saved
        if moved_from:
            self._moved(moved_from)

    def _moved(self, moved_from: str) -> None:
        """Trial directories (and the queued segments' files and model directory snapshot)
        inside ``moved_from`` as the same names inside this search directory."""
        def here(path: str) -> str:
            inside = Path(path).relative_to(moved_from) if Path(path).is_relative_to(moved_from) else None
            return str(self.search_dir / inside) if inside is not None else path

        for trial in self.state["trials"].values():
            trial["dir"] = here(trial["dir"])
        for segment in self.state["pending"]:
            segment.update(run_dir=here(segment["run_dir"]), config=here(segment["config"]),
                           model_dir=here(segment["model_dir"]))

    def start(self) -> None:
        """A fresh search: Determined's initial trials."""
        self.search_dir.mkdir(parents=True, exist_ok=True)
        self.apply(self.method.initial_trials(self.ctx))
        self.save()
        self.flush()

    # ------------------------------------------------------------------------------ actions

    def apply(self, actions: List[methods.Action]) -> None:
        for action in actions:
            if isinstance(action, methods.Create):
                self._create(action)
                continue
            trial = self.state["trials"].get(action.request_id)
            if trial is None:
                continue
            if isinstance(action, methods.Stop):
                trial["stop"] = True
            elif isinstance(action, methods.Pause):
                trial["state"] = "paused"  # its checkpoint waits for a promotion
            elif isinstance(action, methods.Promote):
                self._schedule(trial)  # resume it from its checkpoint to the next rung

    def _create(self, create: methods.Create) -> None:
        number = len(self.state["order"]) + 1
        trial = {
            "number": number, "request_id": create.request_id, "seed": create.seed,
            "hparams": create.hparams, "bracket": create.bracket, "state": "queued",
            "segments": 0, "restarts": 0, "units": 0, "rung": -1, "validations": [],
            "stop": False, "dir": str(self.search_dir / f"trial-{number:03d}"),
        }
        self.state["trials"][create.request_id] = trial
        self.state["order"].append(create.request_id)
        self.apply(self.method.trial_created(self.ctx, create.request_id))
        self._schedule(trial)

    def rungs(self, trial: Dict[str, Any]) -> List[int]:
        """The units of the trial's rungs (its whole length alone for an unstaged search)."""
        if not self.settings.staged:
            return [self.settings.max_length] if self.settings.max_length else []
        return methods.rungs_of(self.method)[trial["bracket"]]

    def trained_fully(self, trial: Dict[str, Any]) -> bool:
        """Whether the trial reached the search's length (a search without one trains each
        trial in one segment, to the length the trial sets)."""
        return self.settings.max_length is None or trial["units"] >= self.settings.max_length

    def next_rung(self, trial: Dict[str, Any]) -> Optional[int]:
        """The units of the trial's next rung past what it trained (None past the last)."""
        return next((units for units in self.rungs(trial) if units > trial["units"]), None)

    def advance(self, trial: Dict[str, Any]) -> None:
        """The trial on to its next rung, with a new place in the decision order."""
        trial["target"] = self.next_rung(trial)
        trial["seq"] = self.state.setdefault("next_seq", 1)
        self.state["next_seq"] += 1

    def _schedule(self, trial: Dict[str, Any], again: bool = False) -> None:
        """Queue the trial's next segment (to its next rung, or its full length), or with
        ``again`` its current one once more (from its latest checkpoint)."""
        key = f"{trial['number']}:{trial['segments'] + (0 if again else 1)}"
        if again:
            trial["attempts"] = trial.get("attempts", 0) + 1
            key += f"#{trial['attempts']}"
        else:
            trial["segments"] += 1
            self.advance(trial)
        trial["state"] = "queued"
        config = Path(trial["dir"]) / f"segment-{trial['segments']}.yaml"
        self.state["pending"].append({
            "key": key, "request_id": trial["request_id"], "trial": trial["number"],
            "seed": trial["seed"], "target": trial["target"], "config": str(config),
            "run_dir": trial["dir"], "model_dir": str(self.model_dir),
            "metric": self.settings.metric, "hparams": trial["hparams"],
            "unit": self.settings.unit, "seq": trial.get("seq"),
            "identity": trial.get("identity"),  # its run id and checkpoint storage, once it has them
        })

    def _segment_config(self, segment: Dict[str, Any]) -> Dict[str, Any]:
        """The experiment file of one segment: the trial's values as consts, trained to target."""
        config = copy.deepcopy(self.raw_config)
        config["hyperparameters"] = {name: {"type": "const", "val": value}
                                     for name, value in segment["hparams"].items()}
        # The trial's whole length: the segment ends at the first validation at or past its
        # target (the worker's HOOKDET_SEGMENT_END), as Determined's searcher stops a trial.
        config["searcher"] = {"name": "single", "metric": self.settings.metric,
                              "smaller_is_better": self.settings.smaller_is_better}
        if self.settings.max_length:
            config["searcher"]["max_length"] = {self.settings.unit: self.settings.max_length}
        warm_start = (self.raw_config.get("searcher") or {}).get("source_checkpoint_uuid")
        if warm_start:  # each trial's first segment starts from it; later ones resume their own
            config["searcher"]["source_checkpoint_uuid"] = warm_start
        config.pop("max_restarts", None)
        return config

    def flush(self) -> None:
        """Queue the decided segments (each once, however often this runs)."""
        if not self.state["pending"]:
            return
        if self.queued is None:  # only this driver queues: after one read, its own count is the store's
            self.queued = self.queue.keys()
        for segment in self.state["pending"]:
            if segment["key"] in self.queued:
                continue
            path = Path(segment["config"])
            path.parent.mkdir(parents=True, exist_ok=True)
            experiment = self._segment_config(segment)
            path.write_text(json.dumps(experiment, indent=1))
            # Carried in the store too, for workers that see only the store (--work-dir). A
            # local worker that waits gets it from this hand, already claimed for it.
            runner = next((each for each in self.runners if each.accepts()), None)
            handed = self.queue.add(dict(segment, experiment=experiment), claimed=runner is not None)
            if runner is not None:
                runner.hand(handed)
            self.queued.add(segment["key"])
        self.state["pending"] = []
        self.save()

    # ------------------------------------------------------------------------------ results

    def _close(self, trial: Dict[str, Any], state: str) -> None:
        trial["state"] = state
        self.apply(self.method.trial_exited(self.ctx, trial["request_id"]))

    def handle(self, segment: Any) -> None:
        """Take the decisions one finished segment calls for (once: its key is then processed)."""
        attrs = attrs_of(segment)
        trial = self.state["trials"][attrs["request_id"]]
        code = attrs.get("exit_code")
        rid = trial["request_id"]
        trial["identity"] = attrs.get("identity") or trial.get("identity")
        if attrs.get(live_trial.LIVE) is not None and (code == 0 or trial["stop"]):  # a Core API trial's end
            self._close(trial, live_trial.ending_state(self, trial, attrs[live_trial.LIVE] if code == 0 else []))
        elif code == 0 and attrs.get("metric") is not None:
            target = attrs["target"] or 0
            units = target if self.settings.unit not in (None, "batches") else int(attrs["batches"])
            self.take_validation(trial, int(attrs["batches"]), max(units, target), attrs["metric"])
            if trial["stop"] or self.trained_fully(trial):
                self._close(trial, "completed" if self.trained_fully(trial) else "stopped")
            elif not self.settings.promote:  # stop-once ASHA: it goes on to the next rung
                self._schedule(trial)
        elif code in (PREEMPTED, -signal.SIGTERM) or self._search_was_killed(attrs):
            self._schedule(trial, again=True)  # not the trial's failure: no restart counted
        elif code == 0:  # trained, but never validated the searcher metric: no retry helps
            logger.error("trial %d: no validation reported the searcher metric '%s' (see %s)",
                         trial["number"], self.settings.metric, trial["dir"])
            self.apply(self.method.trial_exited_early(self.ctx, rid, methods.ERRORED))
            self._close(trial, "errored")
        elif code == BAD_INPUT:  # hookdet run refused the segment: the same input fails again
            logger.error("trial %d: %s (a usage error: not retried; its log: %s.log)", trial["number"],
                         attrs.get("error") or "hookdet run refused it", trial["dir"])
            self.apply(self.method.trial_exited_early(self.ctx, rid, methods.ERRORED))
            self._close(trial, "errored")
        elif code == INVALID_HP:
            trial["state"] = "invalid_hp"
            self.apply(self.method.trial_exited_early(self.ctx, rid, methods.INVALID_HP))
            self._close(trial, "invalid_hp")
        else:
            trial["restarts"] += 1
            if trial["restarts"] <= self.settings.max_restarts:
                self._schedule(trial, again=True)
            else:
                self.apply(self.method.trial_exited_early(self.ctx, rid, methods.ERRORED))
                self._close(trial, "errored")
        self.state["processed"].append(attrs["key"])
        self.save()
        self.flush()
        self.tell_decision(trial, attrs)

    def tell_decision(self, trial: Dict[str, Any], attrs: Dict[str, Any]) -> None:
        """Say what became of the trial after the segment ``attrs`` describe, and show it."""
        self.say(decision_line(self, trial, attrs))
        if self.view is not None:
            self.view.mark(trial)

    def take_validation(self, trial: Dict[str, Any], batches: int, units: int, metric: float) -> None:
        """Feed one validation of the trial to the searcher (a Core API trial's too, as it trains)."""
        trial["units"] = max(units, trial["units"])
        trial["batches"] = batches
        trial["validations"].append([batches, metric])
        rungs = self.rungs(trial) if self.settings.staged else []  # no rungs: -1, shown as "-"
        trial["rung"] = max([i for i, u in enumerate(rungs) if u <= trial["units"]], default=-1)
        self.apply(self.method.validation_completed(self.ctx, trial["request_id"], trial["units"], metric))

    def say(self, line: str) -> None:
        """A decision line: above the live view in a terminal, else printed."""
        if self.live is not None:
            self.live.say(line)
        else:
            print(line, flush=True)

    def show_live(self) -> None:
        """Hand the live view what it draws: the trials as they are now, those at work (from the
        segments :meth:`poll` just read)."""
        if self.live is not None:
            running = {attrs_of(segment).get("request_id") for segment in self.segments_seen
                       if segment.state.name == "RUNNING"}
            trials = [dict(trial) for trial in self.state["trials"].values()]
            self.live.show(trials, running, best_words(self))

    def batches_trained(self) -> int:
        return sum(int(trial.get("batches") or 0) for trial in self.state["trials"].values())

    def _search_was_killed(self, attrs: Dict[str, Any]) -> bool:
        """Whether a segment ended because the driver that ran it in a local worker was killed:
        the search stopped (as when Determined's master goes down), no trial failed; found dead
        as the search resumed, or failed by Optuna's stale-heartbeat cleanup when it resumed
        past the grace period (no outcome then, only its worker). A separate worker process that
        dies still counts against ``max_restarts``."""
        worker = attrs.get("dead_worker") or attrs.get("worker")
        return attrs.get("exit_code") is None and worker in self.state.get("drivers", [])

    def _alive_here(self, segment: Any) -> Optional[bool]:
        """Whether the segment's worker (or its process) is alive: None for another machine's."""
        attrs = attrs_of(segment)
        host, _, pid = str(attrs.get("worker", "")).rpartition(":")
        if host != socket.gethostname():
            return None
        return _pid_alive(int(pid or 0)) or _pid_alive(attrs.get("child_pid"))

    def _dead(self, segment: Any) -> bool:
        """A RUNNING segment whose worker is gone (and whose training process too): by its pid
        on this machine; elsewhere by its beats (the journal's attribute; an RDB store's beats
        are Optuna's, failed by :meth:`reap_stale`)."""
        attrs = attrs_of(segment)
        started = segment.datetime_start.timestamp() if segment.datetime_start else time.time()
        if "worker" not in attrs:  # being claimed right now (or its claimant died doing so)
            return time.time() - started > grace_seconds()
        alive = self._alive_here(segment)
        if alive is not None:
            return not alive
        return not self.queue.keeps_heartbeats and time.time() - float(attrs.get("heartbeat", started)) > grace_seconds()

    def reap_stale(self, running: List[Any]) -> bool:
        """Beat for this machine's live workers, then let Optuna fail every segment whose beats
        stopped past the grace period (another machine's worker lost; this search's own, when it
        was killed and resumed later than that); once a beat's interval at most, not at every
        poll (between two segments, the store is the critical path). Whether it looked."""
        if not self.queue.keeps_heartbeats or time.monotonic() - self._reaped_at < BEAT_SECONDS:
            return False
        self._reaped_at = time.monotonic()
        for segment in running:
            if self._alive_here(segment):
                self.queue.beat(self.queue.trial_id(segment.number))
        self.queue.fail_stale()
        return True

    def poll(self) -> bool:
        """Handle every finished segment and reap dead ones; True when the search is over."""
        done_states = ("COMPLETE", "FAIL")
        handled = False
        while True:  # in number order to the first at work; read again (a decision may queue a retry first)
            processed = set(self.state["processed"])
            stopped_live = set(self.state.get("live_stopped", ()))  # decided: they end when they end
            segments = self.segments_seen = self.queue.segments()
            unprocessed = sorted((s for s in segments if attrs_of(s).get("key") not in processed and (
                s.state.name in done_states or attrs_of(s).get("key") not in stopped_live)),
                key=lambda segment: live_trial.decision_order(self, segment))
            live = unprocessed and live_trial.decision_due(self, unprocessed[0])  # a Core API trial at its rung
            if not live and (not unprocessed or unprocessed[0].state.name not in done_states):
                break
            if live:
                live_trial.decide_rung(self, unprocessed[0])
            else:
                self.handle(unprocessed[0])
            handled = True
        if self.view is not None:
            self.view.update_marked(busy=handled or any(s.state.name == "WAITING" for s in segments))
        if self.reap_stale([segment for segment in segments if segment.state.name == "RUNNING"]):
            segments = self.segments_seen = self.queue.segments()  # what the cleanup failed is finished
        for segment in segments:
            if segment.state.name == "RUNNING" and self._dead(segment):
                self.queue.finish(self.queue.trial_id(segment.number),
                                  {"exit_code": None, "dead_worker": attrs_of(segment).get("worker")},
                                  ok=False)
        open_trials = [t for t in self.state["trials"].values()
                       if t["state"] not in ("completed", "stopped", "errored", "invalid_hp")]
        if open_trials and all(t["state"] == "paused" for t in open_trials) \
                and not self.state["pending"]:
            for trial in open_trials:  # no promotion can come any more: they stop where they are
                self._close(trial, "stopped")
            self.save()
            return False
        return not open_trials and not self.state["pending"]

    # ------------------------------------------------------------------------------ loop

    def run(self, workers: int, slots_per_trial: int = 1, poll: float = 0.3, announce: str = "") -> int:
        """Drive the search with ``workers`` local worker threads; 0 when it completed, 75 when
        it was told to stop (resume it with ``--resume``). ``announce`` is printed once SIGTERM
        and Ctrl-C stop the search gracefully (whoever reads it may send them)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        if announce:
            print(announce, flush=True)
        done = threading.Event()
        threads = []
        self.started_at = time.monotonic()
        self.batches_at_start = self.batches_trained()
        if workers:  # this process's local workers: their death is the search's, not a trial's
            drivers = self.state.setdefault("drivers", [])
            if worker_id() not in drivers:
                drivers.append(worker_id())
                self.save()
        for index in range(workers):
            runner = SegmentRunner(self.queue, Slot(index, workers, slots_per_trial, self.pool), self.pool)
            self.runners.append(runner)
            if self.stopping:  # told to stop before this runner was listed for _on_signal
                runner.terminate()
            thread = threading.Thread(target=self._work, args=(runner, done), daemon=True)
            thread.start()
            threads.append(thread)
        if sys.stdout.isatty():
            self.live = SearchView(sys.stdout, self.settings.metric)
            self.live.open()
        try:
            while True:
                seen = self.queue.generation()
                try:
                    over = self.poll()
                    self.show_live()
                except StoreError as error:
                    self.store_failure = self.store_failure or error
                if self.store_failure is not None:
                    self._stop_for(self.store_failure, threads)
                if over or (self.stopping and not any(t.is_alive() for t in threads)):
                    self.ended = over
                    break
                self.queue.wait_for_change(seen, poll)  # a local worker's finish wakes it at once
        finally:
            done.set()
            if self.view is not None:  # what a stop or a lost store left marked
                self.view.update_marked(busy=False)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.live is not None:
                self.live.close()
                self.live = None
        if over:
            self.poll()
            self.state["finished"] = True
            self.queue.set_info({"finished": True})
            self.save()
            return 0
        for thread in threads:
            thread.join()
        self.poll()
        return PREEMPTED

    def _work(self, runner: SegmentRunner, done: threading.Event) -> None:
        """A local worker thread: :func:`work`, its store failure handed to the driver's loop."""
        try:
            work(self.queue, runner, done)
        except StoreError as error:
            self.store_failure = self.store_failure or error
            self.queue.wake()

    def _stop_for(self, failure: StoreError, threads: List[threading.Thread]) -> None:
        """The store is lost or damaged: stop every local segment (each checkpoints), wait for
        the workers, and end the search with ``failure`` (one line; --resume continues it once
        the store is back)."""
        self._on_signal(signal.SIGTERM, None)
        for thread in threads:
            thread.join()
        raise StoreError(f"{failure}; the search stopped: its trials keep their checkpoints, and "
                         "hookdet run --resume continues it once the store is back")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        for runner in self.runners:
            runner.terminate()
