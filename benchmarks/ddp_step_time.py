"""What hookdet's ``ddp`` plugin costs per step over a raw DistributedDataParallel loop.

One command::

    .venv/bin/python benchmarks/ddp_step_time.py [--steps 300] [--warmup 50] [--rounds 2]

launches two runs of 2 ranks each under torchrun (gloo, one thread per rank), per round:

* ``raw``      ``init_process_group`` + ``DistributedDataParallel`` + SGD, fed by a torch
  DataLoader with a ``DistributedSampler`` — the loop a user would write by hand;
* ``hookdet``  the same model, data, seed and batch size as a ``PyTorchTrial`` under
  ``pytorch.init`` + ``Trainer.fit`` with ``plugins: [ddp]`` (reporting every 100 batches, no
  validation or checkpoint until the end).

Both time the same thing on rank 0: the interval between the starts of consecutive training
steps, so data loading and everything the loop does between steps is inside it. The first
``--warmup`` steps are dropped; the report gives each mode's median step (wall clock, and rank 0's
CPU time, which a machine shared with other work disturbs less), their ratio per round and the
median ratio. It also times, in the raw run, the small gloo all-reduce hookdet uses to agree
on stop requests, alone: blocking, and started asynchronously and collected at the next start
(the time shown is what the training thread spends on one: starting it and collecting the
previous). hookdet starts one about every 0.2 s of training
(:mod:`hookdet.distributed.stop_agreement`), so per batch it costs that time divided by the
batches in 0.2 s.
The report prints the load average (``os.getloadavg``) at the start and the end. Rounds alternate the order of the modes so a
shared machine's drift does not land on one. A worker is this file run with ``--worker MODE``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

RECORDS, FEATURES, HIDDEN, CLASSES = 8192, 256, 512, 10
GLOBAL_BATCH = 128
SEED = 1234
LR = 0.01


def make_model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
    )


def make_dataset() -> Any:
    import torch

    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(RECORDS, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (RECORDS,), generator=generator)
    return torch.utils.data.TensorDataset(inputs, labels)


# ---------------------------------------------------------------------------------------------
# Workers (run under torchrun)
# ---------------------------------------------------------------------------------------------


def raw_worker(steps: int, out: Path) -> None:
    """The hand-written DDP loop; also times the stop-flag all-reduce alone."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    dataset = make_dataset()
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH // size, sampler=sampler)
    starts: List[float] = []
    cpu_starts: List[float] = []
    epoch = 0
    while len(starts) < steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            starts.append(time.perf_counter())
            cpu_starts.append(time.process_time())
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if len(starts) == steps:
                break
        epoch += 1
    flag = torch.zeros(1, dtype=torch.int32)
    flag_times = []
    for _ in range(300):
        began = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        flag.item()
        flag_times.append(time.perf_counter() - began)
    # As the loop does per batch now: start one, collect the one started a batch (here 1 ms) ago.
    flags = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    in_flight = None
    async_times = []
    for index in range(300):
        began = time.perf_counter()
        work = dist.all_reduce(flags[index % 2], op=dist.ReduceOp.MAX, async_op=True)
        if in_flight is not None:
            in_flight.wait()
            flags[(index + 1) % 2].item()
        in_flight = work
        async_times.append(time.perf_counter() - began)
        time.sleep(0.001)
    in_flight.wait()
    if rank == 0:
        out.write_text(json.dumps({"starts": starts, "cpu_starts": cpu_starts, "flag_allreduce": flag_times,
                                   "flag_allreduce_async": async_times}))
    dist.barrier()
    dist.destroy_process_group()


def hookdet_worker(steps: int, out: Path) -> None:
    """The same training as a PyTorchTrial under hookdet with the ddp plugin."""
    import torch

    from hookdet import pytorch

    starts: List[float] = []
    cpu_starts: List[float] = []

    class BenchTrial(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(make_model())
            self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=LR))
            self.loss_fn = torch.nn.CrossEntropyLoss()

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(make_dataset(), batch_size=self.context.get_per_slot_batch_size())

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(make_dataset(), batch_size=self.context.get_per_slot_batch_size())

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            starts.append(time.perf_counter())
            cpu_starts.append(time.process_time())
            inputs, labels = batch
            loss = self.loss_fn(self.model(inputs), labels)
            self.context.backward(loss)
            self.context.step_optimizer(self.optimizer)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
            inputs, labels = batch
            return {"validation_loss": self.loss_fn(self.model(inputs), labels)}

    exp_conf = {
        "hyperparameters": {"global_batch_size": GLOBAL_BATCH},
        "plugins": {"only": ["ddp"]},
        "resources": {"slots_per_trial": 2},
        "reproducibility": {"experiment_seed": SEED},
    }
    with tempfile.TemporaryDirectory() as run_dir:
        with pytorch.init(exp_conf=exp_conf, run_dir=run_dir) as context:
            trial = BenchTrial(context)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(steps), reporting_period=pytorch.Batch(100)
            )
            if context.distributed.get_rank() == 0:
                out.write_text(json.dumps({"starts": starts, "cpu_starts": cpu_starts}))


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def launch(mode: str, steps: int, out: Path) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(Path(__file__).resolve()), "--worker", mode, "--steps", str(steps), "--out", str(out),
    ]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def step_times(starts: List[float], warmup: int) -> List[float]:
    """Intervals between consecutive step starts, after ``warmup`` steps."""
    return [later - earlier for earlier, later in zip(starts[warmup:], starts[warmup + 1 :])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", choices=("raw", "hookdet"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker == "raw":
        raw_worker(args.steps, args.out)
        return 0
    if args.worker == "hookdet":
        hookdet_worker(args.steps, args.out)
        return 0

    medians: Dict[str, List[float]] = {"raw": [], "hookdet": []}
    cpu_medians: Dict[str, List[float]] = {"raw": [], "hookdet": []}
    ratios: List[float] = []
    flag_medians: List[float] = []
    async_flag_medians: List[float] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            order = ("raw", "hookdet") if round_index % 2 == 0 else ("hookdet", "raw")
            this_round: Dict[str, float] = {}
            for mode in order:
                result = launch(mode, args.steps, Path(scratch) / f"{mode}-{round_index}.json")
                this_round[mode] = statistics.median(step_times(result["starts"], args.warmup))
                medians[mode].append(this_round[mode])
                cpu_medians[mode].append(statistics.median(step_times(result["cpu_starts"], args.warmup)))
                if mode == "raw":
                    flag_medians.append(statistics.median(result["flag_allreduce"]))
                    async_flag_medians.append(statistics.median(result["flag_allreduce_async"]))
            ratios.append(this_round["hookdet"] / this_round["raw"])
            print(
                f"round {round_index + 1}: raw {this_round['raw'] * 1e3:.3f} ms/step, "
                f"hookdet {this_round['hookdet'] * 1e3:.3f} ms/step, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    cpu = {mode: statistics.median(values) for mode, values in cpu_medians.items()}
    print(
        f"2 ranks (gloo, 1 thread each), MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, global batch "
        f"{GLOBAL_BATCH}, {args.steps} steps, first {args.warmup} dropped, {os.cpu_count()} CPUs\n"
        f"  raw DDP loop   median step {statistics.median(medians['raw']) * 1e3:.3f} ms "
        f"(rank 0 CPU time {cpu['raw'] * 1e3:.3f} ms)\n"
        f"  hookdet + ddp  median step {statistics.median(medians['hookdet']) * 1e3:.3f} ms "
        f"(rank 0 CPU time {cpu['hookdet'] * 1e3:.3f} ms)\n"
        f"  ratio hookdet/raw, wall (median of rounds): {statistics.median(ratios):.3f}; "
        f"CPU time: {cpu['hookdet'] / cpu['raw']:.3f}\n"
        f"  stop-flag all-reduce alone (gloo, 1 int): blocking median {statistics.median(flag_medians) * 1e6:.0f} us, "
        f"asynchronous (start + collect the previous) median {statistics.median(async_flag_medians) * 1e6:.0f} us\n"
        f"  load average (1 min): {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
