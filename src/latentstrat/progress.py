"""Progress lines a log can be followed by (a Slurm job's log, a local job's log file): one
flushed line at least every `every` seconds with done / total, the mean loss since the last
line (when there is one), the rate, elapsed time and an ETA."""

from __future__ import annotations

import time


class Progress:
    def __init__(self, name: str, total: int, start: int = 0, every: float = 30.0, unit: str = "step", log=print):
        self.name, self.total, self.every, self.unit, self.log = name, total, every, unit, log
        self.t0 = self.t_last = time.time()
        self.start = start
        self.loss, self.n, self.tokens = 0.0, 0, 0
        if start:
            log(f"[{name}] resuming at {unit} {start}/{total}", flush=True)

    def update(self, done: int, loss: float | None = None, tokens: int = 0) -> None:
        if loss is not None:
            self.loss, self.n = self.loss + loss, self.n + 1
        self.tokens += tokens
        now = time.time()
        if now - self.t_last < self.every and done < self.total:
            return
        elapsed = now - self.t0
        eta = elapsed / max(done - self.start, 1) * (self.total - done)
        loss_part = f" loss {self.loss / self.n:.4f}" if self.n else ""
        self.log(
            f"[{self.name}] {self.unit} {done}/{self.total}{loss_part} "
            f"{self.tokens / max(now - self.t_last, 1e-9):,.0f} tokens/s elapsed {elapsed:.0f}s ETA {eta:.0f}s",
            flush=True,
        )
        self.t_last, self.loss, self.n, self.tokens = now, 0.0, 0, 0
