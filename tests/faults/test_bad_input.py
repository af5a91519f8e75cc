"""Bad input and changed input, through ``hookdet run`` in this process: each case ends in well
under its bound with its exit status and one line naming the culprit, and loses nothing saved.

Issue 19's cases 3 (YAML bombs), 6 (silent changes on resume, non-finite loss), 8 (tracebacks
for missing ``global_batch_size``, a run directory that is a file, exports to a directory or a
missing folder) and 11 (a hostile checkpoint, ``--slots -1``).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, List

import pytest
import torch

from hookdet.checkpoints import format as fmt
from hookdet.cli.commands import main
from tests.faults.harness import EXIT_TIMES, TESTS, checkpoint_metadata, write_config

#: Bound on each in-process case, in seconds.
BOUND = 60


def hookdet(case: str, *args: str) -> int:
    started = time.monotonic()
    argv = list(args)
    if argv[0] == "run" and "--model-dir" not in argv:
        argv += ["--model-dir", str(TESTS)]
    status = main(argv)
    elapsed = time.monotonic() - started
    EXIT_TIMES.append((case, elapsed))
    assert elapsed < BOUND, f"{case}: took {elapsed:.1f} s"
    return status


def one_line(capsys: pytest.CaptureFixture, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hookdet: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def alias_bomb(path: Path) -> Path:
    text, previous = 'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n', "a"
    for name in "bcdefghi":  # 10^9 items once expanded, in under 400 bytes
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 10) + "]\n"
        previous = name
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind", ["alias bomb", "5000 levels", "5000 block levels", "300 block levels", "10 MB"])
def test_yaml_beyond_sane_limits_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str) -> None:
    path = tmp_path / "exp.yaml"
    if kind == "alias bomb":
        alias_bomb(path)
    elif kind == "5000 levels":
        path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    elif kind == "10 MB":
        path.write_text("name: x\nhyperparameters:\n  data: '" + "x" * 10_000_000 + "'\n")
    else:
        levels = int(kind.split()[0])
        path.write_text("".join(" " * level + f"k{level}:\n" for level in range(levels)) + " " * levels + "v: 1\n")
    started = time.monotonic()
    assert hookdet(f"YAML: {kind}", "run", str(path)) == 2
    assert time.monotonic() - started < 1.0
    expected = {"alias bomb": "through its aliases", "10 MB": "bytes, over the"}.get(kind, "levels deep")
    if kind == "5000 block levels":
        expected = "bytes, over the"  # 12.5 MB of indentation: refused for its size first
    one_line(capsys, f"{path}:", expected)


def test_missing_global_batch_size_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path / "exp.yaml")
    config.write_text(config.read_text().replace("global_batch_size: 8", "other: 8"))
    assert hookdet("no global_batch_size", "run", str(config), "--run-dir", str(tmp_path / "run")) == 2
    one_line(capsys, "exp.yaml", "hyperparameters.global_batch_size is required")


def test_run_dir_naming_a_file_and_bad_slots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path / "exp.yaml")
    (tmp_path / "afile").write_text("mine")
    assert hookdet("--run-dir is a file", "run", str(config), "--run-dir", str(tmp_path / "afile")) == 2
    one_line(capsys, "afile is a file")
    assert (tmp_path / "afile").read_text() == "mine"
    assert hookdet("--slots -1", "run", str(config), "--slots", "-1", "--run-dir", str(tmp_path / "r")) == 2
    one_line(capsys, "--slots must be a positive number")


def evil_checkpoint(directory: Path) -> None:
    """Reseal ``directory``'s state file as a pickle that would call ``os.system``."""

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("touch PWNED",))

    torch.save({"evil": Evil()}, directory / fmt.STATE_FILE)
    metadata = json.loads((directory / fmt.METADATA_FILE).read_text())
    metadata["files"][fmt.STATE_FILE] = fmt.manifest_entry(directory / fmt.STATE_FILE)
    metadata.pop(fmt.METADATA_DIGEST_KEY)
    metadata[fmt.METADATA_DIGEST_KEY] = fmt.metadata_digest(metadata)
    (directory / fmt.METADATA_FILE).write_text(json.dumps(metadata))


def test_exports_resumes_and_changes(tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "exp.yaml", {"lr": 0.05})
    assert hookdet("train", "run", str(config), "--run-dir", str(run_dir)) == 0
    capsys.readouterr()
    saved = {m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints")}

    # Exports that cannot be written: one line each, nothing left behind.
    (tmp_path / "outdir").mkdir()
    assert hookdet("export to a directory", "export", str(run_dir), str(tmp_path / "outdir")) == 2
    one_line(capsys, "outdir", "is a directory")
    assert hookdet("export into a missing folder", "export", str(run_dir), str(tmp_path / "missing" / "out.pt")) == 2
    one_line(capsys, "missing", "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "outdir", "run"]

    # Resuming with lr changed and max_length already reached: both said, in one warning each.
    changed = write_config(tmp_path / "changed.yaml", {"lr": 0.5})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hookdet"):
        assert hookdet("resume: lr changed, past max_length", "run", str(changed), "--resume", str(run_dir)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("lr: 0.05 -> 0.5" in w and "keeps the checkpoint's" in w for w in warnings), warnings
    assert any("already at or past max_length (12 batches)" in w for w in warnings), warnings
    assert {m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints")} == saved

    # A hostile checkpoint is refused without torch's advice to load it unsafely.
    newest = sorted(checkpoint_metadata(run_dir / "checkpoints"), key=lambda m: m["steps_completed"])[-1]
    evil_checkpoint(run_dir / "checkpoints" / newest["uuid"])
    assert hookdet("hostile checkpoint", "run", str(config), "--resume", str(run_dir / "checkpoints" / newest["uuid"]),
                   "--run-dir", str(tmp_path / "other")) == 2
    line = one_line(capsys, "refused", "GLOBAL")
    assert "weights_only" not in line and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("stop", [False, True])
def test_non_finite_loss_is_warned_and_can_stop(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                caplog: pytest.LogCaptureFixture, stop: bool) -> None:
    fields: Any = {"plugin_config": {"metrics_log": {"stop_on_nonfinite": True}}} if stop else {}
    config = write_config(tmp_path / "exp.yaml", {"lr": 1e30, "optimizer": "sgd"}, **fields)
    with caplog.at_level(logging.WARNING, logger="hookdet"):
        assert hookdet(f"non-finite loss (stop={stop})", "run", str(config), "--run-dir", str(tmp_path / "run")) == 0
    warned: List[str] = [r.getMessage() for r in caplog.records if "non-finite training metric" in r.getMessage()]
    assert len(warned) == 1 and "loss=" in warned[0], warned
    trained = max(m["steps_completed"] for m in checkpoint_metadata(tmp_path / "run" / "checkpoints"))
    assert (trained < 12) if stop else (trained == 12)


def test_a_plugin_that_fails_to_import_is_named_with_its_error(tmp_path: Path) -> None:
    """Issue 19 case 9: the ImportError is shown, not 'unknown plugin'."""
    from tests.faults.harness import REPO, run

    site = tmp_path / "site"
    (site / "broken_plugin").mkdir(parents=True)
    (site / "broken_plugin" / "__init__.py").write_text("import a_module_nobody_installed\n")
    info = site / "hookdet_broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hookdet-broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hookdet.plugins]\nbroken = broken_plugin\n")
    config = write_config(tmp_path / "exp.yaml", plugins=["broken"])
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    status, _, stderr = run(["run", str(config), "--run-dir", str(tmp_path / "run")], "plugin fails to import", env=env)
    assert status == 2, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("hookdet: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert "plugin 'broken'" in lines[0] and "failed to import" in lines[0] and "a_module_nobody_installed" in lines[0]
    assert "unknown plugin" not in lines[0]


def test_a_storage_block_of_retention_counts_alone_keeps_the_default_storage(tmp_path: Path) -> None:
    """Issue 19 case 11: Determined files rely on the cluster's default storage and give only
    retention counts; hookdet stores in the run directory and applies the counts."""
    config = write_config(tmp_path / "exp.yaml", checkpoint_storage={"save_trial_latest": 2, "save_trial_best": 0})
    run_dir = tmp_path / "run"
    assert hookdet("retention counts alone", "run", str(config), "--run-dir", str(run_dir)) == 0
    kept = [metadata["steps_completed"] for metadata in checkpoint_metadata(run_dir / "checkpoints")]
    assert kept == [8, 12]  # checkpoints at 4, 8 and 12; the two latest kept


class FlakyStatePlugin:
    """A plugin whose state cannot be saved (``fail="save"``) or restored (``fail="load"``)."""

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def state_dict(self) -> dict:
        if self.fail == "save":
            raise ValueError("no state today")
        return {"calls": 1}

    def load_state_dict(self, state: dict) -> None:
        if self.fail == "load":
            raise ValueError("that state is not mine")


@pytest.mark.parametrize("fail", ["save", "load"])
def test_a_plugin_whose_state_fails_is_named_not_the_checkpoint_plugin(tmp_path: Path, fail: str) -> None:
    """Issue 19 case 9: the error names the plugin whose state_dict/load_state_dict raised."""
    from hookdet import pytorch
    from hookdet.plugins.manager import PluginError
    from tests.support.resume_trials import RegressionTrial

    hparams = {"records": 32, "global_batch_size": 8, "lr": 0.01}
    exp_conf = {"hyperparameters": hparams, "plugins": {"only": ["checkpoint"]}}

    def train(plugin: FlakyStatePlugin, resume: Any = None) -> None:
        with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=tmp_path / "run", plugins=[plugin]) as context:
            pytorch.Trainer(RegressionTrial(context), context).fit(
                max_length=pytorch.Batch(4 if resume is None else 8), latest_checkpoint=resume
            )

    if fail == "load":
        train(FlakyStatePlugin("never"))  # a checkpoint holding the plugin's state
    with pytest.raises(PluginError) as raised:
        train(FlakyStatePlugin(fail), resume=str(tmp_path / "run") if fail == "load" else None)
    method = "state_dict" if fail == "save" else "load_state_dict"
    assert str(raised.value).startswith(f"plugin 'FlakyStatePlugin' failed in {method}: ValueError(")
    assert "checkpoint" not in str(raised.value).split(":")[0]
