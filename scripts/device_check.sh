#!/usr/bin/env bash
# The checks that need a CUDA device, as one command for a GPU machine (where `python3` has a CUDA
# build of torch). Every trial there trains on cuda:0, so the AMP, apex (torch.amp backend), checkpoint,
# resume and warm-search tests exercise the GPU paths; tests/test_cuda.py adds what only a GPU shows.
#
#   bash scripts/device_check.sh OUT_DIR
#
# hookdet goes into that interpreter as an editable install; dependencies it lacks come from
# wheels in .whl/, downloaded on a machine with pip (the device machine had no network, Python 3.12,
# and lacked these; versions as in .venv):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic pydantic_core annotated-types typing-inspection typing_extensions stevedore \
#     optuna alembic SQLAlchemy Mako colorlog
# TESTS replaces the list of test files; SKIP names steps to leave out (precision checkpoint_io overhead).
# Tests of several ranks are not in the list: on GPUs each rank needs a GPU of its own.
# Writes one log per step into OUT_DIR and prints each one's tail (the tests verbosely: a run cut
# by its time limit still names each test that failed before the cut).
set -u
out=${1:?usage: device_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MLFLOW_DISABLE_TELEMETRY=true
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
rm -rf build

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 started=$SECONDS
  shift 2
  case " ${SKIP:-} " in *" $name "*) return ;; esac
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "== $name: exit $? in $((SECONDS - started)) s"
  tail -n "${TAIL:-12}" "$out/$name.txt"
}

{ nvidia-smi -L; python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))'; uptime; } 2>&1 | tee "$out/machine.txt"
default_tests="tests/test_cuda.py tests/builtin_plugins/test_amp.py tests/builtin_plugins/test_apex.py
  tests/builtin_plugins/test_checkpoint.py tests/builtin_plugins/test_async_checkpoint.py
  tests/builtin_plugins/test_preemption.py tests/builtin_plugins/test_profiler.py tests/builtin_plugins/test_progress.py
  tests/test_resume.py tests/test_reducers.py tests/test_examples.py tests/test_core_loop.py
  tests/test_warm_segments.py tests/test_warm_start.py tests/test_context.py
  tests/test_core_api_tutorials.py::test_mnist_distributed_step_trains_over_nccl_under_the_torch_distributed_launch_layer"
# shellcheck disable=SC2086  # a list of paths
TAIL=25 step tests "${TESTS_SECONDS:-200}" python3 -m pytest -v -n 8 --dist worksteal -p no:cacheprovider --timeout 200 -rfEs \
  ${TESTS:-$default_tests}
step precision 45 python3 scripts/precision_fingerprint.py
step checkpoint_io 90 python3 benchmarks/checkpoint_io.py --sizes 300MB,1GB --repeats 3 --stall-rounds 5
TAIL=20 step overhead "${OVERHEAD_SECONDS:-120}" python3 benchmarks/overhead.py --modes raw,hookdet,lightning \
  --rounds 2 --no-prime
