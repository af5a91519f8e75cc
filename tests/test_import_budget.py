"""Which modules start-up loads: heavy imports (pydantic, YAML, stevedore, TensorBoard, boto3,
Optuna, the CLI's commands) happen when a feature needs them, not when a script imports
``hookdet.pytorch`` or a user types ``hookdet --help``.

The time this saves is measured in ``benchmarks/startup.py``; here each check runs a fresh
interpreter and asserts on ``sys.modules``, which no busy machine can make flaky.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: Third-party packages ``import hookdet.pytorch`` may load beyond what ``import torch`` loads:
#: pluggy (the hook markers every trial module may use) and xxhash (checkpoint checksums, a
#: C extension that loads in microseconds).
ALLOWED_BEYOND_TORCH = {"hookdet", "pluggy", "xxhash"}


def modules_loaded(code: str, before: str = "") -> dict:
    """Top-level modules that ``code`` loads beyond ``before``, and hookdet's own modules, as a
    fresh interpreter sees them."""
    program = textwrap.dedent(
        f"""
        import json, sys
        {before}
        already = set(sys.modules)
        {code}
        new = sorted(set(sys.modules) - already)
        third_party = sorted({{name.split(".")[0] for name in new}} - set(sys.stdlib_module_names) - {{"_distutils_hack"}})
        print(json.dumps({{"third_party": third_party, "hookdet": [m for m in new if m.startswith("hookdet")]}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    loaded["third_party"] = {name for name in loaded["third_party"] if not name.startswith("_")}
    return loaded


def test_import_hookdet_pytorch_loads_nothing_heavy_beyond_torch():
    loaded = modules_loaded("import hookdet.pytorch", before="import torch")
    assert loaded["third_party"] <= ALLOWED_BEYOND_TORCH, loaded["third_party"] - ALLOWED_BEYOND_TORCH
    own = set(loaded["hookdet"])
    for feature in ("hookdet.config", "hookdet.search", "hookdet.cli.commands", "hookdet.plugins.builtin", "hookdet.tensorboard"):
        assert not {m for m in own if m == feature or m.startswith(feature + ".")}, feature


def test_import_hookdet_alone_loads_no_torch():
    """``import hookdet`` (a Trainer-API script's first line, the command line's) must not cost a
    torch import; ``det.pytorch`` and the other public names load on first use."""
    loaded = modules_loaded("import hookdet")
    assert "torch" not in loaded["third_party"]
    assert loaded["third_party"] <= {"hookdet", "pluggy"}, loaded["third_party"]
    on_use = modules_loaded("import hookdet as det; import hookdet.plugin as face; det.pytorch.PyTorchTrial; face.Run; "
                            "face.PluginError")
    assert "torch" in on_use["third_party"]


def test_hookdet_help_loads_no_torch_and_no_pydantic():
    loaded = modules_loaded("from hookdet.cli.commands import build_parser; build_parser().format_help()")
    assert not loaded["third_party"] & {"torch", "pydantic", "yaml", "optuna", "numpy"}, loaded["third_party"]


def test_every_public_name_of_hookdet_resolves():
    import hookdet

    for name in hookdet.__all__:
        assert getattr(hookdet, name) is not None, name
    assert set(hookdet.__all__) <= set(dir(hookdet))



def test_the_commands_that_read_runs_and_a_searchs_driver_load_no_torch(tmp_path):
    """``hookdet runs`` and ``show`` read metadata only, and a search's driver decides and
    queues: none needs torch (a second of a user's wait, each time)."""
    def command(*args: str) -> str:
        return f"from hookdet.cli.commands import main; main({list(args)!r})"

    for loaded in (modules_loaded(command("runs", str(tmp_path))), modules_loaded(command("show", str(tmp_path))),
                   modules_loaded("import hookdet.search.cli, hookdet.search.driver, hookdet.checkpoints.resolver")):
        assert not loaded["third_party"] & {"torch", "numpy"}, loaded["third_party"]
