"""Progress a job can be followed by: one flushed log line at least every `every` seconds (a Slurm
job's log, a local job's log file) with done / total, the mean loss since the last line (when
there is one), the rate, elapsed time and an ETA; and, given a `path`, the same numbers in a small
JSON file rewritten with each line (`read_progress`: what `python -m latentstrat.status` shows for a
running cell)."""

from __future__ import annotations

import json
import time
from pathlib import Path


class Progress:
    def __init__(
        self,
        name: str,
        total: int,
        start: int = 0,
        every: float = 30.0,
        unit: str = "step",
        log=print,
        path: str | Path | None = None,
    ):
        self.name, self.total, self.every, self.unit, self.log = name, total, every, unit, log
        self.t0 = self.t_last = time.time()
        self.start = start
        self.loss, self.n, self.tokens = 0.0, 0, 0
        self.path = Path(path) if path else None
        if start:
            log(f"[{name}] resuming at {unit} {start}/{total}", flush=True)
        self._write(start, None)

    def add_losses(self, losses) -> None:
        """Losses of steps read back together (a trainer reads its step records in windows): the
        next line's mean loss counts them."""
        for v in losses:
            self.loss, self.n = self.loss + float(v), self.n + 1

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
        self._write(done, eta)

    def _write(self, done: int, eta: float | None) -> None:
        if self.path is None:
            return
        rec = {
            "unit": self.unit,
            "done": int(done),
            "total": int(self.total),
            "elapsed_s": round(time.time() - self.t0, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "updated": time.time(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.path)


def read_progress(path: str | Path) -> dict | None:
    """A progress file's numbers, the ETA counted from now (the file's ETA less the time since it was
    written, never below 0); None when there is none or it does not read."""
    try:
        rec = json.loads(Path(path).read_text())
        done, total = int(rec["done"]), int(rec["total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    eta = rec.get("eta_s")
    if eta is not None:
        eta = max(float(eta) - (time.time() - float(rec.get("updated", time.time()))), 0.0)
    return {"unit": rec.get("unit", "step"), "done": done, "total": total, "eta_s": eta}
