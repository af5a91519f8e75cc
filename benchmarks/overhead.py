"""What hookdet costs over a raw PyTorch loop, and over Lightning and Determined.

One command::

    .venv/bin/python benchmarks/overhead.py

trains the same model on the same data from the same seed in separate processes, one per mode:

* ``raw``        a plain PyTorch loop (the reference every ratio divides by);
* ``hookdet``    ``pytorch.init`` + ``Trainer.fit`` with hookdet's *default* plugins (the
  experiment file names none, so whatever ``DEFAULT_PLUGINS`` holds today runs);
* ``lightning``  ``lightning.Trainer.fit``, when an interpreter with Lightning is found;
* ``determined`` ``determined.pytorch.init`` + ``Trainer.fit`` run locally, likewise.

Each mode runs with its own interpreter: ``raw`` and ``hookdet`` with this one, a peer with
``--python MODE=PATH``, else ``$HOOKDET_BENCH_VENVS/<mode>/bin/python`` (default
``<repo>/../bench-venvs``), else this interpreter if it can import the peer; a peer found nowhere is
skipped with a message. The modes are interleaved: each round runs every mode once per workload,
in an order rotated every round, so slow drift of a shared machine spreads over all modes instead
of landing on one; ratios are taken within a round (paired) and the report gives their median.
``workers.py`` says exactly what is timed and how. The run fails (exit status 1) when hookdet's
final weights differ from the raw loop's in any bit, or a mode crashes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "workers.py"
MODES = ("raw", "hookdet", "lightning", "determined")
PEERS = {"lightning": "lightning", "determined": "determined"}  # mode -> module it imports
WORKLOADS = ("mlp", "cnn")
#: Environment every worker gets: one torch/OpenMP/MKL thread, and glibc malloc's mmap and trim
#: thresholds fixed (256 MiB, 1 GiB). Left dynamic, glibc moves them as a process frees large
#: blocks, and depending on what a process allocated before training (imports, set-up) the CNN's
#: activations are either reused from the heap or mapped, faulted in and unmapped every step:
#: about 1,100-1,400 page faults per step, 10-20 % of a CNN step, differing between two
#: processes of the same mode. Fixed thresholds make every mode reuse the heap, so what differs
#: between modes is the frameworks.
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": str(256 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(1024 * 1024 * 1024),
}
#: hookdet's targets: per-step ratio to raw (by workload), start-up ratio.
STEP_TARGETS = {"mlp": 1.03, "cnn": 1.01}
STARTUP_TARGET = 1.5


# ---------------------------------------------------------------------------------------------
# Finding each mode's interpreter
# ---------------------------------------------------------------------------------------------


def default_venvs_dir() -> Path:
    """Where peer virtual environments are looked for: ``$HOOKDET_BENCH_VENVS`` or ``../bench-venvs``."""
    return Path(os.environ.get("HOOKDET_BENCH_VENVS") or REPO.parent / "bench-venvs")


def find_interpreter(mode: str, overrides: Dict[str, str], venvs: Path) -> Tuple[Optional[str], str]:
    """(interpreter, how it was found) for ``mode``, or (None, why not)."""
    if mode in overrides:
        return overrides[mode], "--python"
    if mode not in PEERS:
        return sys.executable, "this interpreter"
    candidate = venvs / mode / "bin" / "python"
    if candidate.exists():
        return str(candidate), f"{venvs}/{mode}"
    if importlib.util.find_spec(PEERS[mode]) is not None:
        return sys.executable, "this interpreter"
    return None, (
        f"no interpreter with {PEERS[mode]!r}: not installed here, no {candidate}; "
        f"give one with --python {mode}=PATH (see benchmarks/README.md)"
    )


def probe(mode: str, python: str) -> Tuple[Optional[Dict[str, str]], str]:
    """Versions of Python, torch and the mode's framework in ``python``; (None, error) if it fails.

    This interpreter answers for itself without a process (``raw`` and ``hookdet`` usually).
    """
    module = PEERS.get(mode, "hookdet" if mode == "hookdet" else None)
    if python == sys.executable:
        try:
            import importlib.metadata

            import torch

            info = {"python": platform.python_version(), "torch": torch.__version__}
            if module:
                importlib.import_module(module)
                info[mode] = importlib.metadata.version(module)
            return info, ""
        except Exception as error:  # a broken install: report it like a failed probe
            return None, repr(error)
    code = (
        "import json, sys, torch\n"
        "info = {'python': sys.version.split()[0], 'torch': torch.__version__}\n"
        + (
            f"import importlib.metadata as m\ninfo[{mode!r}] = m.version({module!r})\n"
            f"import {module}\n"
            if module
            else ""
        )
        + "print(json.dumps(info))"
    )
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=300, env=_worker_env(None)
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, last
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def _worker_env(data_home: Optional[Path]) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(WORKER_ENV)
    env.pop("HOOKDET_TRACE", None)
    env.pop("HOOKDET_RUN_DIR", None)
    if data_home is not None:
        env["XDG_DATA_HOME"] = str(data_home)  # Determined's local checkpoints go here
    return env


# ---------------------------------------------------------------------------------------------
# Running one mode once
# ---------------------------------------------------------------------------------------------


class WorkerFailed(RuntimeError):
    """A worker process exited non-zero; the message holds the end of its log."""


#: The pseudo-terminal's size with ``--terminal`` (rows, columns): a roomy terminal window.
TERMINAL_SIZE = (40, 120)


def spawn(command: List[str], cwd: Path, env: Dict[str, str], log: IO[bytes], terminal: bool) -> int:
    """Run a worker to its end with its output in ``log``; return its exit status.

    With ``terminal`` its stdout and stderr are a pseudo-terminal, so that hookdet's progress
    plugin draws its live view (rich, redrawn by its own thread) as it would for a person
    watching; a thread here copies what the terminal shows into the log."""
    if not terminal:
        return subprocess.call(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
    import fcntl
    import pty
    import struct
    import termios
    import threading

    controller, worker_side = pty.openpty()
    fcntl.ioctl(worker_side, termios.TIOCSWINSZ, struct.pack("HHHH", *TERMINAL_SIZE, 0, 0))
    env = dict(env, TERM="xterm-256color", COLUMNS=str(TERMINAL_SIZE[1]), LINES=str(TERMINAL_SIZE[0]))
    try:
        process = subprocess.Popen(command, cwd=cwd, stdout=worker_side, stderr=worker_side, env=env)
    finally:
        os.close(worker_side)

    def copy_screen() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the worker closed its side of the terminal
                return
            if not chunk:
                return
            log.write(chunk)

    copier = threading.Thread(target=copy_screen, daemon=True)
    copier.start()
    returncode = process.wait()
    copier.join(timeout=10)
    os.close(controller)
    return returncode


def run_worker(
    mode: str,
    workload: str,
    python: str,
    steps: Optional[int],
    warmup: Optional[int],
    keep: Optional[Path],
    tag: str,
    terminal: bool = False,
) -> Tuple[Dict[str, Any], List[Any]]:
    """Run one worker in a fresh scratch directory; return its result (plus the start-up and
    process wall time seen from here) and its final weights."""
    import torch

    scratch = Path(tempfile.mkdtemp(prefix=f"hookdet-bench-{tag}-"))
    cwd, out, data = scratch / "cwd", scratch / "out", scratch / "data"
    for folder in (cwd, out, data):
        folder.mkdir()
    command = [python, str(WORKER), mode, workload, "--out", str(out)]
    if steps is not None:
        command += ["--steps", str(steps)]
    if warmup is not None:
        command += ["--warmup", str(warmup)]
    try:
        with open(scratch / "worker.log", "wb") as log:
            spawned_at = time.time()
            returncode = spawn(command, cwd, _worker_env(data), log, terminal)
            process_wall = time.time() - spawned_at
        if returncode != 0:
            tail = (scratch / "worker.log").read_text(errors="replace").splitlines()[-25:]
            raise WorkerFailed(f"{mode} on {workload} exited {returncode}:\n" + "\n".join(tail))
        result = json.loads((out / "result.json").read_text())
        result["startup_s"] = result["first_step_at"] - spawned_at
        result["interpreter_startup_s"] = result["main_started_at"] - spawned_at
        result["process_wall_s"] = process_wall
        weights = torch.load(out / "weights.pt", weights_only=True)
        return result, weights
    finally:
        if keep is not None:
            destination = keep / tag
            shutil.rmtree(destination, ignore_errors=True)
            shutil.move(str(scratch), destination)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def compare_weights(candidate: Sequence[Any], reference: Sequence[Any]) -> Tuple[bool, float]:
    """(bitwise equal, largest absolute difference) of two lists of tensors in state-dict order."""
    import torch

    if len(candidate) != len(reference):
        return False, float("inf")
    equal, largest = True, 0.0
    for got, want in zip(candidate, reference):
        if got.shape != want.shape or got.dtype != want.dtype:
            return False, float("inf")
        if not torch.equal(got, want):
            equal = False
            if got.is_floating_point():
                largest = max(largest, float((got.double() - want.double()).abs().max()))
            else:
                largest = float("inf")
    return equal, largest


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------

#: (result key, column heading, formatter of the absolute median)
METRICS = (
    ("per_step_s", "per step (wall)", lambda v: f"{v * 1e6:.1f} µs"),
    ("per_step_cpu_s", "per step (CPU)", lambda v: f"{v * 1e6:.1f} µs"),
    ("per_step_window_s", "per step (window mean, wall)", lambda v: f"{v * 1e6:.1f} µs"),
    ("fit_s", "fit", lambda v: f"{v:.2f} s"),
    ("startup_s", "start-up", lambda v: f"{v:.2f} s"),
    ("max_rss_kib", "peak RSS", lambda v: f"{v / 1024:.0f} MiB"),
)


def summarise(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Per workload and mode: median of each metric, and the median, min and max of its ratio
    to the raw loop *of the same round*."""
    by_key: Dict[Tuple[str, str, int], Dict[str, Any]] = {
        (r["workload"], r["mode"], r["round"]): r for r in results
    }
    summary: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for workload in dict.fromkeys(r["workload"] for r in results):
        summary[workload] = {}
        for mode in [m for m in MODES if any(r["mode"] == m and r["workload"] == workload for r in results)]:
            rows = [r for r in results if r["workload"] == workload and r["mode"] == mode]
            entry: Dict[str, Any] = {"rounds": len(rows)}
            for key, _, _ in METRICS:
                entry[key] = statistics.median(r[key] for r in rows)
                ratios = [
                    r[key] / by_key[(workload, "raw", r["round"])][key]
                    for r in rows
                    if (workload, "raw", r["round"]) in by_key
                ]
                if ratios:
                    entry[key + "_ratio"] = statistics.median(ratios)
                    entry[key + "_ratio_range"] = (min(ratios), max(ratios))
            equal = [r.get("weights_equal_raw") for r in rows if r.get("weights_equal_raw") is not None]
            entry["weights_equal_raw"] = all(equal) if equal else None
            entry["max_abs_diff_raw"] = max((r.get("max_abs_diff_raw", 0.0) for r in rows), default=0.0)
            summary[workload][mode] = entry
    return summary


def format_table(summary: Dict[str, Dict[str, Dict[str, Any]]]) -> str:
    """The summary as a Markdown table: median value and median paired ratio to raw per cell."""
    header = ["workload", "mode"] + [title for _, title, _ in METRICS] + ["weights = raw"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload, modes in summary.items():
        for mode, entry in modes.items():
            cells = [workload, mode]
            for key, _, show in METRICS:
                cell = show(entry[key])
                if mode != "raw" and key + "_ratio" in entry:
                    low, high = entry[key + "_ratio_range"]
                    cell += f" ×{entry[key + '_ratio']:.3f} [{low:.3f}–{high:.3f}]"
                cells.append(cell)
            if mode == "raw":
                cells.append("—")
            elif entry["weights_equal_raw"]:
                cells.append("bitwise")
            else:
                cells.append(f"no (max abs diff {entry['max_abs_diff_raw']:.2g})")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_lines(summary: Dict[str, Dict[str, Dict[str, Any]]]) -> List[str]:
    """hookdet's targets, each with its measured value and PASS or MISS."""
    lines = []
    for workload, modes in summary.items():
        hookdet = modes.get("hookdet")
        if hookdet is None or "per_step_s_ratio" not in hookdet:
            continue
        limit = STEP_TARGETS.get(workload)
        for key, what in (("per_step_s_ratio", "wall"), ("per_step_cpu_s_ratio", "CPU")):
            if limit is not None:
                verdict = "PASS" if hookdet[key] <= limit else "MISS"
                lines.append(f"{verdict} {workload}: hookdet/raw per step ({what}) {hookdet[key]:.3f} <= {limit}")
        for peer in PEERS:
            if peer in modes:
                ours, theirs = hookdet["per_step_s"], modes[peer]["per_step_s"]
                verdict = "PASS" if ours < theirs else "MISS"
                lines.append(
                    f"{verdict} {workload}: hookdet faster per step than {peer} "
                    f"({ours * 1e6:.1f} vs {theirs * 1e6:.1f} µs)"
                )
        verdict = "PASS" if hookdet["startup_s_ratio"] <= STARTUP_TARGET else "MISS"
        lines.append(
            f"{verdict} {workload}: hookdet/raw start-up {hookdet['startup_s_ratio']:.3f} <= {STARTUP_TARGET}"
        )
    return lines


def machine_description() -> Dict[str, Any]:
    """What the numbers were measured on (the load average matters on a shared machine)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Per-step, fit, start-up and memory overhead of hookdet against a raw PyTorch "
        "loop, Lightning and Determined; checks hookdet's final weights equal the raw loop's.",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every mode (default 5)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (mlp,cnn)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated; raw always runs")
    parser.add_argument(
        "--python", action="append", default=[], metavar="MODE=PATH",
        help="interpreter for a mode (repeatable), e.g. lightning=/venvs/lightning/bin/python",
    )
    parser.add_argument("--venvs", type=Path, default=default_venvs_dir(),
                        help="folder holding <mode>/bin/python peer environments (default: %(default)s)")
    parser.add_argument("--steps", type=int, help="override every workload's step count (quick runs)")
    parser.add_argument("--warmup", type=int, help="override every workload's warm-up steps")
    parser.add_argument("--no-prime", action="store_true",
                        help="skip the short untimed run of each mode that warms disk caches first")
    parser.add_argument("--json", type=Path, help="write every measurement and the summary here")
    parser.add_argument("--keep", type=Path, help="keep each run's scratch folder (logs, checkpoints) here")
    parser.add_argument("--terminal", action="store_true",
                        help="give every worker a pseudo-terminal, so hookdet's live view runs as a "
                        "person watching would see it (default: output to a log file)")
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    args.modes = ["raw"] + [m for m in MODES if m in modes and m != "raw"]
    args.overrides = {}
    for item in args.python:
        mode, sep, path = item.partition("=")
        if not sep or mode not in MODES:
            parser.error(f"--python takes MODE=PATH with MODE in {list(MODES)}, got {item!r}")
        args.overrides[mode] = path
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)

    interpreters: Dict[str, str] = {}
    versions: Dict[str, Dict[str, str]] = {}
    for mode in args.modes:
        python, how = find_interpreter(mode, args.overrides, args.venvs)
        if python is None:
            print(f"skipping {mode}: {how}", flush=True)
            continue
        info, error = probe(mode, python)
        if info is None:
            if mode in PEERS:
                print(f"skipping {mode}: {python} cannot run it: {error}", flush=True)
                continue
            print(f"error: {mode} cannot run with {python}: {error}", file=sys.stderr)
            return 1
        interpreters[mode], versions[mode] = python, info
        print(f"{mode:<11} {python} ({how}): " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    torch_versions = {info["torch"] for info in versions.values()}
    if len(torch_versions) > 1:
        print(f"warning: modes run different torch versions {sorted(torch_versions)}; "
              "per-step ratios then compare torch builds too", flush=True)
    modes = [m for m in args.modes if m in interpreters]
    machine = machine_description()
    machine["output"] = "pseudo-terminal (live view)" if args.terminal else "log file"
    print(f"machine: {machine['cpu']}, {machine['cpus']} CPUs, load average {machine['load_average']}; "
          f"workers' output to a {machine['output']}", flush=True)

    if not args.no_prime:
        for workload in args.workloads:
            for mode in modes:
                try:
                    run_worker(mode, workload, interpreters[mode], 30, 5, None, f"prime-{mode}-{workload}",
                               args.terminal)
                except WorkerFailed as failure:
                    print(f"error: {failure}", file=sys.stderr)
                    return 1

    results: List[Dict[str, Any]] = []
    failed = False
    for round_index in range(args.rounds):
        workloads_order = args.workloads if round_index % 2 == 0 else list(reversed(args.workloads))
        for workload in workloads_order:
            shift = round_index % len(modes)
            order = modes[shift:] + modes[:shift]
            pending: Dict[str, Tuple[Dict[str, Any], List[Any]]] = {}
            for mode in order:
                tag = f"r{round_index}-{workload}-{mode}"
                try:
                    result, weights = run_worker(
                        mode, workload, interpreters[mode], args.steps, args.warmup, args.keep, tag,
                        args.terminal,
                    )
                except WorkerFailed as failure:
                    print(f"error: {failure}", file=sys.stderr, flush=True)
                    failed = True
                    continue
                result["round"] = round_index
                result["position"] = order.index(mode)
                pending[mode] = (result, weights)
                print(
                    f"round {round_index + 1}/{args.rounds} {workload:<4} {mode:<11} "
                    f"step {result['per_step_s'] * 1e6:8.1f} µs (CPU {result['per_step_cpu_s'] * 1e6:8.1f}) "
                    f"fit {result['fit_s']:6.2f} s  start-up {result['startup_s']:5.2f} s  "
                    f"rss {result['max_rss_kib'] / 1024:5.0f} MiB",
                    flush=True,
                )
            if "raw" in pending:
                for mode, (result, weights) in pending.items():
                    if mode == "raw":
                        continue
                    equal, largest = compare_weights(weights, pending["raw"][1])
                    result["weights_equal_raw"], result["max_abs_diff_raw"] = equal, largest
                    if mode == "hookdet" and not equal:
                        print(f"error: round {round_index + 1} {workload}: hookdet's final weights "
                              f"differ from the raw loop's (max |diff| {largest:.3g})", file=sys.stderr)
                        failed = True
            results.extend(result for result, _ in pending.values())

    summary = summarise(results)
    machine["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print()
    print(f"machine: {machine['cpu']}, {machine['cpus']} CPUs, {machine['platform']}; load average "
          f"{machine['load_average']} at start, {machine['load_average_end']} at end")
    print(f"rounds: {args.rounds}; each cell: median over rounds, ×median ratio to raw of the same "
          "round [min–max]")
    print(format_table(summary))
    print()
    for line in target_lines(summary):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"machine": machine, "versions": versions, "interpreters": interpreters,
             "argv": sys.argv, "results": results, "summary": summary},
            indent=2,
        ))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
