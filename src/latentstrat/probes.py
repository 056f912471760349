"""Linear probes: how much strategy information a latent carries (design sections 5.6 and 6, docs/design.md).

A probe is a logistic regression from a latent to a label, scored by stratified k-fold
cross-validation. In each fold the features are standardized with the training fold's mean and
population standard deviation (a constant feature keeps scale 1), and the model is fitted on the
training fold by L-BFGS, minimizing the summed log-loss plus 0.5 * ||W||^2 on the coefficients
(inverse regularization strength C = 1; the intercept is not penalized). Two classes get one
coefficient vector (a sigmoid), more classes one vector each (a softmax). This is scikit-learn's
`make_pipeline(StandardScaler(), LogisticRegression())` (the tests check it against that), written
with numpy and scipy so that a probe job does not import scikit-learn. A held-out example is
predicted as the most probable class, ties to the first label in sorted order.

Next to every accuracy the probe reports the chance level (majority-class rate of the probed
examples), a shuffled-label control (the same CV on permuted labels) and the chance-corrected
accuracy (accuracy - chance) / (1 - chance): 0 at the majority rate, 1 when perfect. A class with
fewer examples than folds is dropped (named in `dropped`), not the whole task, so a probe's task
set does not move with one rare class; a probe left with fewer than 2 classes reports status 'na'
with the reason instead of a number.

Probes on the evaluate records of a cell:
- within_task_router: per task, router-sampled z -> the strategy the generation followed
  (generations that match exactly one strategy);
- posterior: per task, posterior mean mu_q(x, y_true) -> the true strategy (examples whose
  true trace is unambiguous);
- global_router: over all tasks, router-sampled z -> "task:followed_strategy".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from latentstrat.io import read_parquet, write_parquet

PROBE_NAMES = ("within_task_router", "posterior", "global_router")
PROBE_COLUMNS = [
    "cell_id",
    "task",
    "probe",
    "accuracy",
    "chance",
    "shuffled_accuracy",
    "corrected",
    "n",
    "n_classes",
    "folds",
    "n_dropped",
    "dropped",
    "status",
    "reason",
    "example_ids",
    "labels",
    "oof_correct",
]
# the record columns the probes read
PROBE_RECORD_COLUMNS = [
    "cell_id",
    "task",
    "example_id",
    "strategy",
    "followed_strategy",
    "ambiguous",
    "router_z",
    "posterior_mu",
]


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


# scikit-learn's LogisticRegression defaults, which the probe reproduces
_C = 1.0  # inverse L2 strength: minimize C * sum(log-loss) + 0.5 * ||W||^2
_TOL = 1e-4  # L-BFGS stops when the largest gradient entry of the mean-loss objective is below this
_FTOL = 64 * np.finfo(np.float64).eps  # ... or when the objective stops decreasing (relative)
_MAXLS = 50  # line-search steps per iteration


def stratified_folds(y, folds: int, seed: int) -> np.ndarray:
    """Fold index (0..folds-1) of every example, stratified by label.

    With `rng = np.random.default_rng(seed)`, the classes are taken in sorted label order; each
    class's example positions are permuted by `rng.permutation` and dealt round-robin into the
    folds, starting at the fold after the one that received the previous class's last example
    (the first class starts at fold 0). So each class has floor or ceil(count / folds) examples
    in every fold, and fold sizes differ by at most 1 overall. The same (labels, folds, seed)
    always give the same folds.
    """
    y = np.asarray(y)
    if folds < 2:
        raise ValueError(f"stratified_folds: need folds >= 2, got {folds}")
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=np.int64)
    start = 0
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        fold[members] = (start + np.arange(len(members))) % folds
        start = (start + len(members)) % folds
    return fold


def _standardize(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sets scaled by the training set's mean and population std, as StandardScaler: a
    feature whose variance is within rounding error of 0 keeps scale 1 (it is only centred)."""
    n = len(X_train)
    mean = X_train.mean(axis=0)
    var = X_train.var(axis=0)
    eps = np.finfo(np.float64).eps
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    scale = np.where(constant, 1.0, np.sqrt(var))
    return (X_train - mean) / scale, (X_test - mean) / scale


def _binary_objective(theta: np.ndarray, X: np.ndarray, t: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    """Mean binary log-loss + 0.5 * l2 * ||w||^2 and its gradient; theta = [w (d), intercept],
    t = 1 for the second class, 0 for the first."""
    w, b = theta[:-1], theta[-1]
    z = X @ w + b
    loss = np.mean(np.logaddexp(0.0, z) - t * z) + 0.5 * l2 * (w @ w)
    r = (np.exp(-np.logaddexp(0.0, -z)) - t) / len(t)  # (sigmoid(z) - t) / n
    grad = np.empty_like(theta)
    grad[:-1] = X.T @ r + l2 * w
    grad[-1] = r.sum()
    return float(loss), grad


def _multinomial_objective(theta: np.ndarray, X: np.ndarray, Y: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    """Mean softmax log-loss + 0.5 * l2 * ||W||^2 and its gradient; theta is the [K, d + 1] array
    [W | intercepts] flattened in Fortran order (scikit-learn's layout), Y the one-hot labels [n, K]."""
    n, k = Y.shape
    Wb = theta.reshape((k, -1), order="F")
    W, b = Wb[:, :-1], Wb[:, -1]
    Z = X @ W.T + b
    zmax = Z.max(axis=1, keepdims=True)
    lse = zmax + np.log(np.exp(Z - zmax).sum(axis=1, keepdims=True))
    loss = np.mean(lse[:, 0] - (Z * Y).sum(axis=1)) + 0.5 * l2 * np.sum(W * W)
    R = (np.exp(Z - lse) - Y) / n  # (softmax - one-hot) / n
    grad = np.empty_like(Wb, order="F")
    grad[:, :-1] = R.T @ X + l2 * W
    grad[:, -1] = R.sum(axis=0)
    return float(loss), grad.ravel(order="F")


@dataclass(frozen=True, eq=False)
class _LogisticModel:
    classes: np.ndarray  # sorted labels
    coef: np.ndarray  # [1, d] for 2 classes, [K, d] otherwise
    intercept: np.ndarray  # [1] or [K]

    def decision(self, X: np.ndarray) -> np.ndarray:
        return X @ self.coef.T + self.intercept

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        Z = self.decision(X)
        if len(self.classes) == 2:
            p = np.exp(-np.logaddexp(0.0, -Z[:, 0]))
            return np.stack([1.0 - p, p], axis=1)
        Z = Z - Z.max(axis=1, keepdims=True)
        E = np.exp(Z)
        return E / E.sum(axis=1, keepdims=True)

    def predict(self, X: np.ndarray) -> np.ndarray:
        Z = self.decision(X)
        if len(self.classes) == 2:
            return self.classes[(Z[:, 0] > 0).astype(np.int64)]
        return self.classes[np.argmax(Z, axis=1)]  # argmax: ties to the first class


def _fit_logistic(X: np.ndarray, y: np.ndarray, max_iter: int) -> _LogisticModel:
    """L2-penalized logistic regression (scikit-learn's LogisticRegression() objective and
    L-BFGS settings) on features X [n, d] (already standardized) and labels y [n], >= 2 classes."""
    # imported here: scipy.optimize takes ~0.2 s to import (after numpy and pandas), and readers of probe tables
    # (read_probes) never fit
    from scipy.optimize import minimize

    classes, codes = np.unique(y, return_inverse=True)
    n, d = X.shape
    k = len(classes)
    if k < 2:
        raise ValueError(f"_fit_logistic: need at least 2 classes, got {k}")
    l2 = 1.0 / (_C * n)  # the objective is the mean log-loss: penalty 0.5 * ||W||^2 / (C n)
    if k == 2:
        fun, target, theta0 = _binary_objective, (codes == 1).astype(np.float64), np.zeros(d + 1)
    else:
        fun, target, theta0 = _multinomial_objective, np.eye(k)[codes], np.zeros(k * (d + 1))
    res = minimize(
        fun,
        theta0,
        args=(X, target, l2),
        method="L-BFGS-B",
        jac=True,
        options={"maxiter": max_iter, "maxls": _MAXLS, "gtol": _TOL, "ftol": _FTOL},
    )
    # not converged within max_iter: keep the last iterate, as scikit-learn does (with a warning)
    if k == 2:
        return _LogisticModel(classes, res.x[None, :-1], res.x[-1:])
    Wb = res.x.reshape((k, -1), order="F")
    return _LogisticModel(classes, Wb[:, :-1].copy(), Wb[:, -1].copy())


def _cv_accuracy(X: np.ndarray, y: np.ndarray, folds: int, seed: int, max_iter: int) -> tuple[float, np.ndarray]:
    """(mean fold accuracy, out-of-fold correctness per example) over `stratified_folds`; in each
    fold the scaler and the model are fitted on the training part only."""
    fold = stratified_folds(y, folds, seed)
    accs, correct = [], np.zeros(len(y), dtype=bool)
    for f in range(folds):
        te = fold == f
        X_tr, X_te = _standardize(X[~te], X[te])
        hit = _fit_logistic(X_tr, y[~te], max_iter).predict(X_te) == y[te]
        correct[te] = hit
        accs.append(float(np.mean(hit)))
    return float(np.mean(accs)), correct


def linear_probe(
    X, y, folds: int = 5, seed: int = 0, max_iter: int = 1000, shuffled_control: bool = True
) -> ProbeResult:
    """CV accuracy of the logistic-regression probe (module docstring) from features X [n, d] to
    labels y [n], over `stratified_folds(labels, folds, seed)`.

    `shuffled_control=False` skips the permuted-label CV (NaN): the trainer's validation
    tracks probe accuracy over steps and leaves the controls to the evaluate-stage probes.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(str)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(
            f"linear_probe: features must be [n, d] with n = len(labels); got {X.shape} and {len(y)} labels"
        )
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
        return ProbeResult(
            float("nan"), chance, float("nan"), float("nan"), n, k, folds, n_dropped, dropped, "na", reason
        )

    if k < 2:
        why = f" after dropping classes with fewer than folds={folds} examples ({dropped})" if small else ""
        return na(f"{k} class{'es' if k != 1 else ''} among {n} examples{why} (need at least 2)")
    acc, correct = _cv_accuracy(X, y, folds, seed, max_iter)
    shuffled = float("nan")
    if shuffled_control:
        y_shuffled = np.random.default_rng(seed).permutation(y)
        shuffled = _cv_accuracy(X, y_shuffled, folds, seed, max_iter)[0]
    return ProbeResult(
        acc,
        chance,
        shuffled,
        chance_corrected(acc, chance),
        n,
        k,
        folds,
        n_dropped,
        dropped,
        "ok",
        "",
        tuple(int(i) for i in kept),
        tuple(y.tolist()),
        tuple(bool(c) for c in correct),
    )


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
        raise ValueError(
            f"records {records_path}: column {column!r} has vectors of different lengths {sorted(lengths.unique())}"
        )
    return np.stack([np.asarray(v, dtype=np.float64) for v in rows[column]])


def _probe_row(cfg, cell_id, task, probe, X, y, example_ids) -> dict:
    p = cfg["probes"]
    if len(y) == 0:
        res = ProbeResult(
            float("nan"),
            float("nan"),
            float("nan"),
            float("nan"),
            0,
            0,
            p["folds"],
            0,
            "",
            "na",
            "no eligible examples",
        )
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
        raise ValueError(
            f"evaluate records {records_path} have no rows for task {task!r} (tasks: {sorted(df['task'].unique())})"
        )
    cid = df["cell_id"].iloc[0]
    r = router_probe_rows(rows)
    q = posterior_probe_rows(rows)
    out = pd.DataFrame(
        [
            _probe_row(
                cfg,
                cid,
                task,
                "within_task_router",
                _features(r, "router_z", records_path),
                r["followed_strategy"].to_numpy(),
                r["example_id"].to_numpy(),
            ),
            _probe_row(
                cfg,
                cid,
                task,
                "posterior",
                _features(q, "posterior_mu", records_path),
                q["strategy"].to_numpy(),
                q["example_id"].to_numpy(),
            ),
        ],
        columns=PROBE_COLUMNS,
    )
    write_parquet(out, out_path)
    return out


def probe_global(cfg: dict, records_path, out_path) -> pd.DataFrame:
    """One router probe over all tasks: z -> "task:followed_strategy" -> one row at out_path."""
    df = _read_records(records_path)
    r = router_probe_rows(df)
    labels = (r["task"] + ":" + r["followed_strategy"]).to_numpy()
    out = pd.DataFrame(
        [
            _probe_row(
                cfg,
                df["cell_id"].iloc[0],
                "global",
                "global_router",
                _features(r, "router_z", records_path),
                labels,
                r["example_id"].to_numpy(),
            )
        ],
        columns=PROBE_COLUMNS,
    )
    write_parquet(out, out_path)
    return out


def read_probes(paths) -> pd.DataFrame:
    """Concatenate probe tables (per task and global), checking their columns."""
    frames = [read_parquet(p, "probe table", columns=PROBE_COLUMNS) for p in paths]
    if not frames:
        return pd.DataFrame(columns=PROBE_COLUMNS)
    return pd.concat(frames, ignore_index=True)
