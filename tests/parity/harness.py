"""Run a parity case under the real Determined and under hookdet, each in a process of its own.

A case is a trial class of :mod:`tests.parity.trials`, its hyperparameters and ``Trainer.fit``
arguments; optionally a second phase that resumes, in new processes, from the first phase's
latest checkpoint. Each framework gets its own working directory (Determined's local checkpoints
go under ``$XDG_DATA_HOME``, hookdet's under ``$HOOKDET_RUN_DIR``) and the same seed. The two
frameworks' processes run side by side: each is deterministic on its own, so sharing the CPU
changes their timing, never their results. Each process is forked from a warm server of its
framework (:mod:`tests.parity.warm_runner`), or a new interpreter under ``HOOKDET_TEST_COLD=1``.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from tests.parity import warm_runner

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("runner.py")
FRAMEWORKS = ("determined", "hookdet")
TIMEOUT_S = 240


def determined_python() -> Path:
    """Python of the virtual environment holding ``determined==0.38.1``.

    ``$HOOKDET_PARITY_DET_PYTHON``, else ``.venv-determined/bin/python`` under the repository
    (``.ci/run`` builds it).
    """
    configured = os.environ.get("HOOKDET_PARITY_DET_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".venv-determined" / "bin" / "python"


def require_determined() -> Path:
    """The Determined Python; in CI its absence fails the suite, locally it skips it."""
    python = determined_python()
    if python.exists():
        return python
    reason = (
        f"the parity suite needs Determined 0.38.1 at {python} (set HOOKDET_PARITY_DET_PYTHON, "
        "or create .venv-determined as .ci/run does)"
    )
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(framework: str, workdir: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(
        PARITY_FRAMEWORK=framework,
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        XDG_DATA_HOME=str(workdir / "data"),  # Determined's local checkpoint storage, outside
        # the working directory: Determined copies that directory into every checkpoint
        XDG_CACHE_HOME=str(workdir / "cache"),
        HOOKDET_RUN_DIR=str(workdir / "run"),
        MLFLOW_DISABLE_TELEMETRY="true",
        # Determined's local resume needs it on torch >= 2.6 (its bug); hookdet never does.
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1" if framework == "determined" else "",
    )
    env.pop("PYTHONPATH", None)
    if framework == "hookdet":
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    return env


def _launch(
    framework: str, spec: Dict[str, Any], workdir: Path, phase: int, ranks: int, unset_env: tuple = ()
) -> List[Any]:
    python = str(require_determined()) if framework == "determined" else sys.executable
    spec_path = workdir / f"spec{phase}.json"
    spec_path.write_text(json.dumps(spec))
    processes = []
    port = _free_port()
    # Determined's ranks also talk over ZMQ, on ports 12360/12361 unless these say otherwise:
    # two cases at once (two xdist workers) would collide on the defaults.
    zmq_ports = {"INTER_TRAIN_PROCESS_COMM_PORT_1": str(_free_port()),
                 "INTER_TRAIN_PROCESS_COMM_PORT_2": str(_free_port())}
    for rank in range(ranks):
        env = _environment(framework, workdir)
        for variable in unset_env:
            env.pop(variable, None)
        if ranks > 1:
            env.update(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(ranks), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(ranks),  # what torchrun sets
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                USE_TORCH_DISTRIBUTED="true" if framework == "determined" else "",
            )
            if framework == "determined":
                env.update(zmq_ports)
        out = workdir / f"phase{phase}-rank{rank}.json"
        log = workdir / f"phase{phase}-rank{rank}.log"
        log.write_text("")
        if warm_runner.cold():
            with open(log, "w") as output:
                process = subprocess.Popen(
                    [python, str(RUNNER), str(spec_path), str(out)], cwd=_cwd(workdir), env=env,
                    stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                )
        else:
            process = warm_runner.server(python, framework).start(
                str(spec_path), str(out), env, str(_cwd(workdir)), str(log))
        processes.append((process, out, log))
    return processes


def _cwd(workdir: Path) -> Path:
    """The runner's working directory (the user's model directory); it holds only the uuid note."""
    cwd = workdir / "cwd"
    cwd.mkdir(exist_ok=True)
    return cwd


def _collect(processes: List[Any], framework: str, workdir: Path, timeout_s: float) -> List[Dict[str, Any]]:
    records = []
    for process, out, log in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(process)
            process.wait()
        if process.returncode != 0 or not out.exists():
            text = log.read_text()[-4000:]
            raise AssertionError(f"{framework} runner failed (rc {process.returncode}):\n{text}")
        records.append(json.loads(out.read_text()))
    return records


def _kill_session(process: Any) -> None:
    """SIGKILL a runner's session (its own, cold or warm); None: the warm server died first."""
    if process.pid is None:
        return
    try:
        os.killpg(process.pid, 9)
    except ProcessLookupError:
        pass


def run_case(
    tmp_path: Path,
    trial: str,
    fit: Dict[str, Any],
    hparams: Optional[Dict[str, Any]] = None,
    exp_conf: Optional[Dict[str, Any]] = None,
    init: Optional[Dict[str, Any]] = None,
    resume_fit: Optional[Dict[str, Any]] = None,
    ranks: int = 1,
    seed: int = 1234,
    frameworks: tuple = FRAMEWORKS,
    unset_env: tuple = (),
    timeout_s: float = TIMEOUT_S,
    experiment_file: Optional[Dict[str, Any]] = None,
    resume_from: str = "latest_checkpoint.txt",
) -> Dict[str, List[List[Dict[str, Any]]]]:
    """Run the case under each framework: ``{framework: [phase][rank] record}``.

    With ``resume_fit``, phase 2 resumes from the last checkpoint phase 1 wrote (the uuid its
    callbacks' ``on_checkpoint_upload_end`` saw), or from its first with ``resume_from``
    ``"first_checkpoint.txt"``. ``unset_env`` names environment variables the
    runners must not get (to show what a user without the workaround sees). A runner still
    running after ``timeout_s`` is killed and fails the case with its log.
    """
    require_determined()
    spec = {
        "trial": trial,
        "hparams": hparams or {"global_batch_size": 4 * ranks},
        "exp_conf": exp_conf if exp_conf is not None else default_exp_conf(),
        # Determined turns TensorBoard on without depending on it, so its training crashes at the
        # first report (an expected difference); every other case turns it off for both.
        "init": init if init is not None else {"enable_tensorboard_logging": False},
        "fit": fit,
        "seed": seed,
    }
    if experiment_file is not None:  # trained from the file, fit and init unused (experiment_files.py)
        spec["experiment_file"] = experiment_file
    phases = [spec]
    if resume_fit is not None:
        phases.append(dict(copy.deepcopy(spec), fit=resume_fit, resume_from=resume_from))
    results: Dict[str, List[List[Dict[str, Any]]]] = {name: [] for name in frameworks}
    for phase, phase_spec in enumerate(phases):
        launched = {}
        for name in frameworks:
            workdir = tmp_path / name
            workdir.mkdir(parents=True, exist_ok=True)
            launched[name] = _launch(name, phase_spec, workdir, phase, ranks, unset_env)
        for name in frameworks:
            results[name].append(_collect(launched[name], name, tmp_path / name, timeout_s))
    return results


def default_exp_conf() -> Dict[str, Any]:
    return {
        "searcher": {"name": "single", "metric": "val_loss", "smaller_is_better": True,
                     "max_length": {"batches": 8}},
        "hyperparameters": {"global_batch_size": 4},
    }
