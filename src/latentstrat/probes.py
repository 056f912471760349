"""Linear probes: how much strategy information a latent carries (design sections 5.6 and 6, docs/design.md).

A probe is a multinomial logistic regression on standardized features (the scaler is fitted
inside each fold: a Pipeline), scored by stratified k-fold cross-validation. Next to every
accuracy it reports the chance level (majority-class rate of the probed examples), a
shuffled-label control (the same CV on permuted labels) and the chance-corrected accuracy
(accuracy - chance) / (1 - chance): 0 at the majority rate, 1 when perfect. A class with fewer
examples than folds is dropped (named in `dropped`), not the whole task, so a probe's task set
does not move with one rare class; a probe left with fewer than 2 classes reports status 'na'
with the reason instead of a number.

Probes on the evaluate records of a cell:
- within_task_router: per task, router-sampled z -> the strategy the generation followed
  (generations that match exactly one strategy);
- posterior: per task, posterior mean mu_q(x, y_true) -> the true strategy (examples whose
  true trace is unambiguous);
- global_router: over all tasks, router-sampled z -> "task:followed_strategy".
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from latentstrat.io import read_parquet, write_parquet

PROBE_NAMES = ("within_task_router", "posterior", "global_router")
PROBE_COLUMNS = ["cell_id", "task", "probe", "accuracy", "chance", "shuffled_accuracy", "corrected", "n",
                 "n_classes", "folds", "n_dropped", "dropped", "status", "reason", "example_ids", "labels", "oof_correct"]
# the record columns the probes read
PROBE_RECORD_COLUMNS = ["cell_id", "task", "example_id", "strategy", "followed_strategy", "ambiguous",
                        "router_z", "posterior_mu"]


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float  # mean CV accuracy (nan when na)
    chance: float  # majority-class rate of the probed examples
    shuffled_accuracy: float  # the same CV on permuted labels
    corrected: float  # (accuracy - chance) / (1 - chance)
    n: int  # examples probed (after dropping rare classes)
    n_classes: int
    folds: int
    n_dropped: int  # examples of dropped classes
    dropped: str  # "class:count, ..." of classes with fewer examples than folds
    status: str  # ok | na
    reason: str  # why na ('' when ok)
    kept: tuple = ()  # positions (in the input) of the probed examples
    labels: tuple = ()  # their labels
    oof_correct: tuple = ()  # out-of-fold prediction correct, per probed example (bootstrap intervals)

    def to_row(self, **keys) -> dict:
        d = asdict(self)
        d.pop("kept")
        return {**keys, **d, "labels": list(self.labels), "oof_correct": [bool(c) for c in self.oof_correct]}


def _cv_accuracy(X: np.ndarray, y: np.ndarray, folds: int, seed: int, max_iter: int) -> tuple[float, np.ndarray]:
    """(mean fold accuracy, out-of-fold correctness per example)."""
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    accs, correct = [], np.zeros(len(y), dtype=bool)
    for tr, te in cv.split(X, y):
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(X[tr], y[tr])
        hit = clf.predict(X[te]) == y[te]
        correct[te] = hit
        accs.append(float(np.mean(hit)))
    return float(np.mean(accs)), correct


def linear_probe(X, y, folds: int = 5, seed: int = 0, max_iter: int = 1000, shuffled_control: bool = True) -> ProbeResult:
    """CV accuracy of a multinomial logistic regression from features X [n, d] to labels y [n].

    `shuffled_control=False` skips the permuted-label CV (NaN): the trainer's validation
    tracks probe accuracy over steps and leaves the controls to the evaluate-stage probes.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(str)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"linear_probe: features must be [n, d] with n = len(labels); got {X.shape} and {len(y)} labels")
    if not np.isfinite(X).all():
        raise ValueError("linear_probe: features contain NaN or inf")
    counts = Counter(y.tolist())
    small = {s: c for s, c in sorted(counts.items()) if c < folds}
    dropped = ", ".join(f"{s}:{c}" for s, c in small.items())
    kept = np.arange(len(y))
    if small:  # too rare to stratify: leave the class out, keep the task
        keep = ~np.isin(y, list(small))
        X, y, kept = X[keep], y[keep], kept[keep]
        counts = Counter(y.tolist())
    n, k, n_dropped = len(y), len(counts), sum(small.values())
    chance = max(counts.values()) / n if n else float("nan")

    def na(reason: str) -> ProbeResult:
        return ProbeResult(float("nan"), chance, float("nan"), float("nan"), n, k, folds, n_dropped, dropped, "na", reason)

    if k < 2:
        why = f" after dropping classes with fewer than folds={folds} examples ({dropped})" if small else ""
        return na(f"{k} class{'es' if k != 1 else ''} among {n} examples{why} (need at least 2)")
    acc, correct = _cv_accuracy(X, y, folds, seed, max_iter)
    shuffled = float("nan")
    if shuffled_control:
        y_shuffled = np.random.default_rng(seed).permutation(y)
        shuffled = _cv_accuracy(X, y_shuffled, folds, seed, max_iter)[0]
    return ProbeResult(acc, chance, shuffled, chance_corrected(acc, chance), n, k, folds, n_dropped, dropped, "ok", "",
                       tuple(int(i) for i in kept), tuple(y.tolist()), tuple(bool(c) for c in correct))


def chance_corrected(accuracy: float, chance: float) -> float:
    """(accuracy - chance) / (1 - chance): 0 at the majority-class rate, 1 when perfect; NaN
    when chance is 1 (one class: nothing to predict)."""
    return (accuracy - chance) / (1 - chance) if chance < 1 else float("nan")


# ----------------------------------------------------------------------------- on records


def _features(rows: pd.DataFrame, column: str, records_path) -> np.ndarray:
    if rows.empty:
        return np.zeros((0, 0))
    lengths = rows[column].map(len)
    if lengths.nunique() != 1:
        raise ValueError(f"records {records_path}: column {column!r} has vectors of different lengths {sorted(lengths.unique())}")
    return np.stack([np.asarray(v, dtype=np.float64) for v in rows[column]])


def _probe_row(cfg, cell_id, task, probe, X, y, example_ids) -> dict:
    p = cfg["probes"]
    if len(y) == 0:
        res = ProbeResult(float("nan"), float("nan"), float("nan"), float("nan"), 0, 0, p["folds"], 0, "", "na",
                          "no eligible examples")
    else:
        res = linear_probe(X, y, folds=p["folds"], seed=p["seed"], max_iter=p["max_iter"])
    ids = [str(example_ids[i]) for i in res.kept]
    return res.to_row(cell_id=cell_id, task=task, probe=probe, example_ids=ids)


def _read_records(records_path) -> pd.DataFrame:
    df = read_parquet(records_path, "evaluate records", columns=PROBE_RECORD_COLUMNS)
    if df.empty:
        raise ValueError(f"evaluate records {records_path} has no rows")
    ids = df["cell_id"].unique()
    if len(ids) != 1:
        raise ValueError(f"evaluate records {records_path} mix cells {sorted(ids)}")
    return df


def router_probe_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Generations that followed exactly one strategy (the within-task router probe's data)."""
    return df[df["followed_strategy"].notna()]


def posterior_probe_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Examples whose true trace is unambiguous (the posterior probe's data)."""
    return df[~df["ambiguous"].astype(bool)]


def probe_task(cfg: dict, records_path, task: str, out_path) -> pd.DataFrame:
    """Within-task router probe and posterior probe of one task -> two rows at out_path."""
    df = _read_records(records_path)
    rows = df[df["task"] == task]
    if rows.empty:
        raise ValueError(f"evaluate records {records_path} have no rows for task {task!r} (tasks: {sorted(df['task'].unique())})")
    cid = df["cell_id"].iloc[0]
    r = router_probe_rows(rows)
    q = posterior_probe_rows(rows)
    out = pd.DataFrame([
        _probe_row(cfg, cid, task, "within_task_router", _features(r, "router_z", records_path), r["followed_strategy"].to_numpy(),
                   r["example_id"].to_numpy()),
        _probe_row(cfg, cid, task, "posterior", _features(q, "posterior_mu", records_path), q["strategy"].to_numpy(),
                   q["example_id"].to_numpy()),
    ], columns=PROBE_COLUMNS)
    write_parquet(out, out_path)
    return out


def probe_global(cfg: dict, records_path, out_path) -> pd.DataFrame:
    """One router probe over all tasks: z -> "task:followed_strategy" -> one row at out_path."""
    df = _read_records(records_path)
    r = router_probe_rows(df)
    labels = (r["task"] + ":" + r["followed_strategy"]).to_numpy()
    out = pd.DataFrame([_probe_row(cfg, df["cell_id"].iloc[0], "global", "global_router",
                                   _features(r, "router_z", records_path), labels, r["example_id"].to_numpy())],
                       columns=PROBE_COLUMNS)
    write_parquet(out, out_path)
    return out


def read_probes(paths) -> pd.DataFrame:
    """Concatenate probe tables (per task and global), checking their columns."""
    frames = [read_parquet(p, "probe table", columns=PROBE_COLUMNS) for p in paths]
    if not frames:
        return pd.DataFrame(columns=PROBE_COLUMNS)
    return pd.concat(frames, ignore_index=True)
