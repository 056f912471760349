"""Data parallelism over CPU processes, for the entangle step (`entangle.processes`).

On a CPU the embedded model's matmuls are small (a batch is ~2400 tokens x 128 wide), and they
scale poorly across threads: on 2 cores one 2-thread process runs the entangle step at ~24k
tokens/s while two 1-thread processes at once run ~16k each (docs/entangle.md). So the stage
can split each batch between processes instead of threads: every rank takes its share of the
same global batch, the gradients are summed across ranks (one all-reduce per step, gloo), and
every rank applies the same update, so the weights stay identical (checked at the end).

    with workers(2, fn, args, kwargs):   # rank 0 is this process; rank 1 runs fn(*args, rank=1, world=2, **kwargs)
        fn(*args, rank=0, world=2, **kwargs)

Workers are plain `python -m latentstrat.runtime.parallel <job>` subprocesses, not multiprocessing's
spawn, which would re-import the caller's main module (a Snakemake rule script runs its whole
body at import). The job file (the pickled function and arguments) and the process group's
file store live in a temporary folder that is removed on exit.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(minutes=10)  # a rank waiting longer than this for the others fails


class WorkerError(RuntimeError):
    """A data-parallel worker failed; the message has its exit code and the tail of its output."""


def _init(store: str, rank: int, world: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=TIMEOUT)


@contextlib.contextmanager
def workers(world: int, fn, args: tuple = (), kwargs: dict | None = None, threads: int = 1):
    """Start ranks 1..world-1 as subprocesses running fn(*args, rank=r, world=world, **kwargs)
    with `threads` torch threads each, and join the process group as rank 0. On exit, waits for
    the workers; a worker that failed raises RuntimeError with its exit code and the tail of its
    output (WorkerError). If the body raises, the workers are killed."""
    if world < 2:
        raise ValueError(f"parallel.workers: world must be >= 2, got {world}")
    if dist.is_initialized():
        raise RuntimeError("parallel.workers: a process group is already initialized in this process")
    with tempfile.TemporaryDirectory(prefix="latentstrat-parallel-") as tmp:
        tmp = Path(tmp)
        store = str(tmp / "store")
        with open(tmp / "job.pkl", "wb") as f:
            pickle.dump(dict(fn=fn, args=args, kwargs=kwargs or {}, store=store, world=world, threads=threads), f)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        with contextlib.ExitStack() as closing:
            procs, logs = _start_ranks(tmp, world, env, closing)
            try:
                _wait_ready(procs, logs, tmp)
                _init(store, 0, world)
                try:
                    yield
                finally:
                    dist.destroy_process_group()
            except BaseException as e:
                for p in procs:  # a worker that died first is the likely cause: give it time to exit
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=5)
                failed = _failures(procs, logs)
                for p in procs:
                    p.kill()
                    p.wait()
                if failed and not isinstance(e, WorkerError):
                    raise WorkerError(f"data-parallel worker failed: {failed}") from e
                raise
            _join(procs, logs)


def _start_ranks(tmp: Path, world: int, env: dict, closing: contextlib.ExitStack) -> tuple[list, list]:
    """Ranks 1..world-1 as subprocesses of `python -m latentstrat.runtime.parallel job.pkl rank`, each
    writing to its own log (closed by `closing`)."""
    procs, logs = [], []
    for rank in range(1, world):
        log = closing.enter_context(open(tmp / f"rank{rank}.log", "w+"))
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "latentstrat.runtime.parallel", str(tmp / "job.pkl"), str(rank)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs, logs


def _join(procs: list, logs: list) -> None:
    """Wait for the workers (killed after TIMEOUT); a worker that failed raises WorkerError."""
    for p in procs:
        try:
            p.wait(timeout=TIMEOUT.total_seconds())
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    failed = _failures(procs, logs)
    if failed:
        raise WorkerError(f"data-parallel worker failed: {failed}")


def run(world: int, threads: int, fn, args: tuple = (), kwargs: dict | None = None, rank0_kwargs: dict | None = None):
    """Run fn(*args, rank=r, world=world, **kwargs) on `world` ranks of threads // world torch
    threads each and return rank 0's result. Rank 0 is this process and also gets
    `rank0_kwargs` (what stays here, e.g. a log callback); world 1 is a plain call. The
    process's torch threads are restored afterwards."""
    kwargs = kwargs or {}
    here = {**kwargs, **(rank0_kwargs or {})}
    before, rank_threads = torch.get_num_threads(), max(1, threads // world)
    torch.set_num_threads(rank_threads)
    try:
        if world == 1:
            return fn(*args, rank=0, world=1, **here)
        with workers(world, fn, args, kwargs, threads=rank_threads):
            return fn(*args, rank=0, world=world, **here)
    finally:
        torch.set_num_threads(before)


def _wait_ready(procs, logs, tmp: Path) -> None:
    """Wait until every worker has loaded its job (a worker that dies on the way, e.g. on an
    import or unpickling error, is reported now instead of after the process group's timeout)."""
    while not all((tmp / f"rank{rank}.ready").exists() for rank in range(1, len(procs) + 1)):
        failed = _failures(procs, logs)
        if failed:
            raise WorkerError(f"data-parallel worker failed to start: {failed}")
        time.sleep(0.05)


def _failures(procs, logs) -> str:
    """The workers that have exited with a nonzero code, each with the tail of its output."""
    return "; ".join(
        f"rank {rank} exit code {p.returncode}: {_tail(log)}"
        for rank, (p, log) in enumerate(zip(procs, logs), start=1)
        if p.poll() not in (0, None)
    )


def _tail(log, n: int = 1500) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-n:].strip()


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor across ranks, in place, with one all-reduce (flattened float32)."""
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def check_identical(params: list[torch.Tensor], what: str) -> None:
    """Raise on every rank unless `params` are bitwise equal across ranks (elementwise max == min)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in params])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    diff = float((hi - lo).abs().max())
    if diff != 0.0:
        raise RuntimeError(f"{what}: the data-parallel ranks diverged (max difference {diff:.3g})")


def main(argv=None) -> None:
    job_path, rank = sys.argv[1:] if argv is None else argv
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    torch.set_num_threads(job["threads"])
    Path(job_path).with_name(f"rank{rank}.ready").touch()
    _init(job["store"], int(rank), job["world"])
    try:
        job["fn"](*job["args"], rank=int(rank), world=job["world"], **job["kwargs"])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
