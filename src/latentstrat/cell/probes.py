"""Linear probes: how much strategy information a latent carries (design sections 5.6 and 6, docs/design.md).

Every probe is scikit-learn's `make_pipeline(StandardScaler(), LogisticRegression(...))` (a
multinomial logistic regression on standardized features; two classes get one coefficient vector)
scored out of fold over `stratified_folds` (in each fold the scaler and the model see the
training part only). A class with fewer examples than folds is dropped (named in `dropped`), not
the whole task, so a probe's task set does not move with one rare class.

Two kinds of probe:
- `linear_probe`: cross-validated accuracy (L2 strength C = 1), next to the chance level
  (majority-class rate of the probed examples), a shuffled-label control (the same CV on permuted
  labels) and the chance-corrected accuracy (accuracy - chance) / (1 - chance). These describe one
  cell. The chance level is the cell's own outcome (the mix of strategies *it* followed), so it is
  no baseline for comparing cells: dividing by 1 - chance rewards a collapsed mix.
- `information_probe`: the primary endpoint's per-task measurement (docs/design.md, "Primary
  endpoint"). Per probed example, out of fold, the bits the probe's prediction gains over the
  training fold's class frequencies: log2 p(s | z) - log2 p_prior(s). Their mean is a
  cross-validated estimate of the mutual information I(z; s) in bits: about 0 when z says nothing
  (the probe's L2 strength is chosen by an inner CV on log-loss, so on noise it falls back to the
  class frequencies), 0 when one strategy is followed (nothing to tell), H(s) when z fixes s.
  p is the probe's probability mixed with the training fold's class frequencies, weight
  1 / n_train (`mixed_probability`): no example costs more than log2(n_train) bits below the
  prior, where a clip at 1e-12 let one confidently wrong prediction cost ~40 bits.
  The CV is repeated over `repeats` fold seeds (config `probes.information_repeats`): an
  example's bits are the mean over the repeats (`oof_bits`), and the repeats themselves are kept
  (`oof_bits_repeats`) so the bootstrap can carry the probe's own variance (fold split and
  refit; tabulate.information_replicates).

Probes on the evaluate records of a cell:
- within_task_router: per task, router-sampled z -> the strategy the generation followed
  (generations that match exactly one strategy);
- router_information: per task, the same examples, information in bits (`oof_bits` per example);
  the task's value (`information`) is their sum over the task's test examples (a generation that
  follows no single strategy carries 0 bits about it) divided by the number of those examples and by
  the entropy of the data's strategy mix on them (`strategy_entropy`, the true strategies of the same
  test inputs: one baseline for every cell evaluated on them): 0 = z says nothing, 1 = z fixes the
  strategy of every generation;
- router_mu_information: the same, from the router's mean `router_mu` instead of the sampled z:
  what x alone tells about the followed strategy through the router (z's mean is a function of x);
- posterior: per task, posterior mean mu_q(x, y_true) -> the true strategy (examples whose
  true trace is unambiguous);
- global_router: over all tasks, router-sampled z -> "task:followed_strategy".
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from latentstrat.io import read_parquet, write_parquet
from latentstrat.metrics import M
from latentstrat.runtime import host

if TYPE_CHECKING:
    from latentstrat.jobs import Job

# the information probes: probe name -> the record column of its features
INFORMATION_PROBES = {M.router_information: "router_z", M.router_mu_information: "router_mu"}
PROBE_COLUMNS = [
    "cell_id",
    "task",
    "probe",
    "accuracy",
    "chance",
    "shuffled_accuracy",
    "corrected",
    "information",
    "strategy_entropy",
    "n_task",
    "C",
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
    "oof_bits",
    "oof_bits_repeats",
]
# columns a probe table written before them may lack (read as absent: one repeat)
OPTIONAL_PROBE_COLUMNS = ("oof_bits_repeats",)
# the record columns the probes read
PROBE_RECORD_COLUMNS = [
    "cell_id",
    "task",
    "example_id",
    "strategy",
    "followed_strategy",
    "ambiguous",
    "router_z",
    "router_mu",
    "posterior_mu",
]
# inverse L2 strengths the information probe chooses from by inner CV on log-loss (1e-4 .. 1e2)
INFORMATION_CS = tuple(float(c) for c in np.logspace(-4, 2, 13))


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float  # mean CV accuracy (nan when na or an information probe)
    chance: float  # majority-class rate of the probed examples
    shuffled_accuracy: float  # the same CV on permuted labels
    corrected: float  # (accuracy - chance) / (1 - chance)
    n: int  # examples probed (after dropping rare classes)
    n_classes: int
    folds: int
    n_dropped: int  # examples of dropped classes
    dropped: str  # "class:count, ..." of classes with fewer examples than folds
    status: str  # ok | na
    reason: str  # why na, or a note ('' when neither)
    kept: tuple = ()  # positions (in the input) of the probed examples
    labels: tuple = ()  # their labels
    oof_correct: tuple = ()  # out-of-fold prediction correct, per probed example (bootstrap intervals)
    oof_bits: tuple = ()  # information probe: out-of-fold bits gained over the class frequencies, per probed example
    bits: float = math.nan  # information probe: mean of oof_bits (I_cv(z; s) over the probed examples)
    C: float = math.nan  # information probe: median over folds and repeats of the L2 strength the inner CV chose
    oof_bits_repeats: tuple = ()  # information probe: [repeats][probed example] bits, one fold seed each

    def to_row(self, **keys) -> dict:
        d = asdict(self)
        d.pop("kept")
        d.pop("bits")
        return {
            **keys,
            **d,
            "labels": list(self.labels),
            "oof_correct": [bool(c) for c in self.oof_correct],
            "oof_bits": [float(b) for b in self.oof_bits],
            "oof_bits_repeats": [[float(b) for b in r] for r in self.oof_bits_repeats],
        }


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


def _logistic(max_iter: int):
    """The accuracy probe's model: scikit-learn's logistic regression (C = 1) on standardized features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))


def _logistic_cv(folds: int, seed: int, max_iter: int):
    """The information probe's model: the L2 strength chosen from INFORMATION_CS by an inner
    stratified CV on log-loss, then refitted on the whole training part."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    inner = StratifiedKFold(folds, shuffle=True, random_state=seed)
    return make_pipeline(
        StandardScaler(),
        LogisticRegressionCV(
            Cs=list(INFORMATION_CS),
            l1_ratios=(0.0,),
            cv=inner,
            scoring="neg_log_loss",
            max_iter=max_iter,
            use_legacy_attributes=False,
        ),
    )


def _fit(model, X, y):
    with warnings.catch_warnings():  # a class with fewer members than inner folds, an unconverged fit:
        warnings.simplefilter("ignore")  # scikit-learn warns and goes on, as do we (the last iterate is kept)
        return model.fit(X, y)


def _cv_accuracy(X: np.ndarray, y: np.ndarray, folds: int, seed: int, max_iter: int) -> tuple[float, np.ndarray]:
    """(mean fold accuracy, out-of-fold correctness per example) over `stratified_folds`."""
    fold = stratified_folds(y, folds, seed)
    accs, correct = [], np.zeros(len(y), dtype=bool)
    for f in range(folds):
        te = fold == f
        hit = _fit(_logistic(max_iter), X[~te], y[~te]).predict(X[te]) == y[te]
        correct[te] = hit
        accs.append(float(np.mean(hit)))
    return float(np.mean(accs)), correct


def _checked(X, y, who: str) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(str)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"{who}: features must be [n, d] with n = len(labels); got {X.shape} and {len(y)} labels")
    if not np.isfinite(X).all():
        raise ValueError(f"{who}: features contain NaN or inf")
    return X, y


def _drop_rare(X, y, folds: int):
    """(X, y, kept positions, dropped text, n dropped) without the classes of fewer than `folds` examples."""
    small = {s: c for s, c in sorted(Counter(y.tolist()).items()) if c < folds}
    kept = np.arange(len(y))
    if small:  # too rare to stratify: leave the class out, keep the task
        keep = ~np.isin(y, list(small))
        X, y, kept = X[keep], y[keep], kept[keep]
    return X, y, kept, ", ".join(f"{s}:{c}" for s, c in small.items()), sum(small.values())


def linear_probe(
    X, y, folds: int = 5, seed: int = 0, max_iter: int = 1000, shuffled_control: bool = True
) -> ProbeResult:
    """CV accuracy of the logistic-regression probe (module docstring) from features X [n, d] to
    labels y [n], over `stratified_folds(labels, folds, seed)`; fewer than 2 classes (after dropping
    rare ones) is status 'na' with the reason.

    `shuffled_control=False` skips the permuted-label CV (NaN): the trainer's validation
    tracks probe accuracy over steps and leaves the controls to the evaluate-stage probes.
    """
    X, y = _checked(X, y, "linear_probe")
    X, y, kept, dropped, n_dropped = _drop_rare(X, y, folds)
    counts = Counter(y.tolist())
    n, k = len(y), len(counts)
    chance = max(counts.values()) / n if n else float("nan")
    if k < 2:
        why = f" after dropping classes with fewer than folds={folds} examples ({dropped})" if dropped else ""
        reason = f"{k} class{'es' if k != 1 else ''} among {n} examples{why} (need at least 2)"
        nan = float("nan")
        return ProbeResult(nan, chance, nan, nan, n, k, folds, n_dropped, dropped, "na", reason)
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


def mixed_probability(p_probe, p_prior, n_train: int):
    """The probability the information probe scores: the probe's, mixed with the training fold's
    class frequency at weight 1 / n_train, (1 - w) p_probe + w p_prior. An example then gains at
    least log2(w p_prior) - log2(p_prior) = -log2(n_train) bits: one confidently wrong
    prediction costs at most log2(n_train) bits (where a 1e-12 clip let it cost ~40), and a
    confident right one loses at most -log2(1 - w (1 - p_prior)) bits (0.003 bits for n_train =
    240, balanced classes)."""
    w = 1.0 / n_train
    return (1.0 - w) * np.asarray(p_probe, dtype=float) + w * np.asarray(p_prior, dtype=float)


def _cv_bits(X, y, folds: int, seed: int, max_iter: int) -> tuple[np.ndarray, list[float]]:
    """(out-of-fold bits per example, the L2 strength chosen per fold) over
    stratified_folds(y, folds, seed), the inner CV seeded by `seed` too."""
    bits, chosen = np.zeros(len(y)), []
    fold = stratified_folds(y, folds, seed)
    for f in range(folds):
        te = fold == f
        classes, counts = np.unique(y[~te], return_counts=True)
        prior = dict(zip(classes, counts / counts.sum()))
        model = _fit(_logistic_cv(folds, seed, max_iter), X[~te], y[~te])
        proba = model.predict_proba(X[te])
        col = {c: i for i, c in enumerate(model.classes_)}
        p_prior = np.array([prior[s] for s in y[te]])
        p = mixed_probability(proba[np.arange(int(te.sum())), [col[s] for s in y[te]]], p_prior, int((~te).sum()))
        bits[te] = np.log2(p) - np.log2(p_prior)
        chosen.append(float(np.ravel(model[-1].C_)[0]))
    return bits, chosen


def information_probe(X, y, folds: int = 5, seed: int = 0, max_iter: int = 1000, repeats: int = 1) -> ProbeResult:
    """Cross-validated information from features X [n, d] to labels y [n] (module docstring):
    per probed example, out of fold over `stratified_folds`, log2 of the logistic probe's p(y | x)
    (L2 strength by inner CV on log-loss; mixed with the class frequencies, `mixed_probability`)
    minus log2 of the training fold's frequency of y. The CV runs `repeats` times, repeat r on the
    fold seed `seed + r` (repeat 0 is the single CV of `repeats=1`): `oof_bits_repeats` holds every
    repeat's bits, `oof_bits` their mean per example, `bits` the mean of that. Fewer than 2 classes
    (after dropping rare ones): every probed example carries 0 bits in every repeat (status ok: one
    followed strategy leaves nothing for z to tell)."""
    if repeats < 1:
        raise ValueError(f"information_probe: need repeats >= 1, got {repeats}")
    X, y = _checked(X, y, "information_probe")
    X, y, kept, dropped, n_dropped = _drop_rare(X, y, folds)
    n, k = len(y), len(set(y.tolist()))
    per_repeat = np.zeros((repeats, n))
    reason, chosen = "", []
    if k < 2:
        reason = f"{k} strateg{'ies' if k != 1 else 'y'} followed among {n} probed examples: 0 bits"
    else:
        for r in range(repeats):
            per_repeat[r], c = _cv_bits(X, y, folds, seed + r, max_iter)
            chosen += c
    bits = per_repeat.mean(axis=0)
    return ProbeResult(
        float("nan"),
        max(Counter(y.tolist()).values()) / n if n else float("nan"),
        float("nan"),
        float("nan"),
        n,
        k,
        folds,
        n_dropped,
        dropped,
        "ok",
        reason,
        tuple(int(i) for i in kept),
        tuple(y.tolist()),
        (),
        tuple(float(b) for b in bits),
        float(bits.mean()) if n else 0.0,
        float(np.median(chosen)) if chosen else float("nan"),
        tuple(tuple(float(b) for b in row) for row in per_repeat),
    )


def chance_corrected(accuracy: float, chance: float) -> float:
    """(accuracy - chance) / (1 - chance): 0 at the majority-class rate, 1 when perfect; NaN
    when chance is 1 (one class: nothing to predict)."""
    return (accuracy - chance) / (1 - chance) if chance < 1 else float("nan")


def entropy_bits(labels) -> float:
    """Entropy in bits of the labels' empirical distribution (0 for one label, NaN for none)."""
    counts = np.array(list(Counter(list(labels)).values()), dtype=float)
    if not len(counts):
        return float("nan")
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum()) + 0.0


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


def _empty_result(folds: int, status: str, reason: str) -> ProbeResult:
    nan = float("nan")
    return ProbeResult(nan, nan, nan, nan, 0, 0, folds, 0, "", status, reason, bits=0.0)


def _probe_row(p: dict, cell_id, task, probe, X, y, example_ids) -> dict:
    if len(y) == 0:
        res = _empty_result(p["folds"], "na", "no eligible examples")
    else:
        res = linear_probe(X, y, folds=p["folds"], seed=p["seed"], max_iter=p["max_iter"])
    ids = [str(example_ids[i]) for i in res.kept]
    return res.to_row(cell_id=cell_id, task=task, probe=probe, example_ids=ids)


def information_repeats(p: dict) -> int:
    """`probes.information_repeats` (1 in a config written before the key)."""
    return int(p.get("information_repeats", 1))


def _information_row(p: dict, cell_id, task, X, y, example_ids, task_rows: pd.DataFrame, probe: str) -> dict:
    """An information probe's row of a task (`probe`: router_information or router_mu_information):
    `information` = the probed examples' out-of-fold bits (mean over the repeats) summed, over the
    task's test examples (`n_task`) and the entropy of their true strategies (`strategy_entropy`,
    bits)."""
    if len(y) == 0:
        res = _empty_result(p["folds"], "ok", "no generation followed exactly one strategy: 0 bits")
    else:
        res = information_probe(
            X, y, folds=p["folds"], seed=p["seed"], max_iter=p["max_iter"], repeats=information_repeats(p)
        )
    h = entropy_bits(task_rows["strategy"])
    n_task = len(task_rows)
    info = float(sum(res.oof_bits)) / n_task / h if h > 0 else float("nan")
    status, reason = ("ok", res.reason) if h > 0 else ("na", "the task's test inputs have one true strategy")
    ids = [str(example_ids[i]) for i in res.kept]
    row = res.to_row(cell_id=cell_id, task=task, probe=probe, example_ids=ids)
    return {**row, "information": info, "strategy_entropy": h, "n_task": n_task, "status": status, "reason": reason}


def _read_records(records_path) -> pd.DataFrame:
    df = read_parquet(records_path, "evaluate records", columns=PROBE_RECORD_COLUMNS)
    if df.empty:
        raise ValueError(f"evaluate records {records_path} has no rows")
    ids = df["cell_id"].unique()
    if len(ids) != 1:
        raise ValueError(f"evaluate records {records_path} mix cells {sorted(ids)}")
    return df


def router_probe_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Generations that followed exactly one strategy (the within-task router probes' data)."""
    return df[df["followed_strategy"].notna()]


def posterior_probe_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Examples whose true trace is unambiguous (the posterior probe's data)."""
    return df[~df["ambiguous"].astype(bool)]


def task_table(p: dict, df: pd.DataFrame, task: str, records_path) -> pd.DataFrame:
    """Within-task router probe, router information, router-mean information and posterior probe
    of one task: four rows."""
    rows = df[df["task"] == task]
    if rows.empty:
        raise ValueError(
            f"evaluate records {records_path} have no rows for task {task!r} (tasks: {sorted(df['task'].unique())})"
        )
    cid = df["cell_id"].iloc[0]
    r = router_probe_rows(rows)
    q = posterior_probe_rows(rows)
    Xr, yr, ids_r = (
        _features(r, "router_z", records_path),
        r["followed_strategy"].to_numpy(),
        r["example_id"].to_numpy(),
    )
    Xq, yq, ids_q = _features(q, "posterior_mu", records_path), q["strategy"].to_numpy(), q["example_id"].to_numpy()
    return pd.DataFrame(
        [
            _probe_row(p, cid, task, "within_task_router", Xr, yr, ids_r),
            _information_row(p, cid, task, Xr, yr, ids_r, rows, M.router_information),
            _information_row(
                p, cid, task, _features(r, "router_mu", records_path), yr, ids_r, rows, M.router_mu_information
            ),
            _probe_row(p, cid, task, "posterior", Xq, yq, ids_q),
        ],
        columns=PROBE_COLUMNS,
    )


def global_table(p: dict, df: pd.DataFrame, records_path) -> pd.DataFrame:
    """One router probe over all tasks: z -> "task:followed_strategy": one row."""
    r = router_probe_rows(df)
    labels = (r["task"] + ":" + r["followed_strategy"]).to_numpy()
    X = _features(r, "router_z", records_path)
    row = _probe_row(p, df["cell_id"].iloc[0], "global", "global_router", X, labels, r["example_id"].to_numpy())
    return pd.DataFrame([row], columns=PROBE_COLUMNS)


def probe_task(p: dict, records_path, task: str, out_path) -> pd.DataFrame:
    """One task's probes (task_table) from a cell's evaluate records, written to out_path."""
    out = task_table(p, _read_records(records_path), task, records_path)
    write_parquet(out, out_path)
    return out


def probe_global(p: dict, records_path, out_path) -> pd.DataFrame:
    """The global router probe (global_table) from a cell's evaluate records, written to out_path."""
    out = global_table(p, _read_records(records_path), records_path)
    write_parquet(out, out_path)
    return out


def probe_cell(p: dict, records_path, tasks, out_paths) -> pd.DataFrame:
    """Every probe of one cell, the probe job: per task (task_table) and the global one, each
    written to its file (`out_paths`: one per task in the order of `tasks`, then the global one;
    paths.Paths.probe_files). The records are read once and the libraries imported once."""
    tasks, out_paths = list(tasks), list(out_paths)
    if len(out_paths) != len(tasks) + 1:
        raise ValueError(f"probe_cell: {len(tasks)} tasks need {len(tasks) + 1} output paths, got {len(out_paths)}")
    df = _read_records(records_path)
    tables = [task_table(p, df, t, records_path) for t in tasks] + [global_table(p, df, records_path)]
    prov = host.provenance("cpu")  # the probes fit on the CPU
    for table, path in zip(tables, out_paths):
        write_parquet(table, path, provenance=prov)
    return pd.concat(tables, ignore_index=True)


def read_probes(paths) -> pd.DataFrame:
    """Concatenate probe tables (per task and global), checking their columns (a table written
    before an OPTIONAL_PROBE_COLUMNS column reads it as missing values)."""
    required = [c for c in PROBE_COLUMNS if c not in OPTIONAL_PROBE_COLUMNS]
    frames = [read_parquet(p, "probe table", columns=required).reindex(columns=PROBE_COLUMNS) for p in paths]
    if not frames:
        return pd.DataFrame(columns=PROBE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def run(job: Job) -> None:
    """The probes rule's job: every task's probe table and the global one, from one cell's records."""
    probe_cell(job.config["probes"], job.input["records"], job.params["tasks"], list(job.outputs))
