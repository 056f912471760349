"""Tabulate stage: one cell's row of the collection's table, every metric of the registry
computed from its evaluate records and probe tables (design section 6, docs/design.md), with 95%
bootstrap intervals, written as the cell's row.parquet and its bootstrap replicates
(`write_cell_row`, the tabulate rule). The
metric names, derived-metric formulas and the bootstrap's resampling are the registry's
(latentstrat.metrics).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from latentstrat.aggregations import aggregation as declared_aggregation
from latentstrat.cell.probes import INFORMATION_PROBES, entropy_bits, read_probes
from latentstrat.cells import CELL_KEYS, Cell, as_cell, beta_label
from latentstrat.io import parquet_provenance, read_parquet, write_parquet
from latentstrat.metrics import (
    ACTIVE_UNIT_VARIANCE,
    BOOT_SEED,
    BOOTSTRAP_FILE,
    BOOTSTRAP_METRICS,
    LOSS_METRICS,
    METRICS,
    N_BOOT,
    M,
    derive,
    interval,
    resample_counts,
)

if TYPE_CHECKING:
    from latentstrat.jobs import Job

# probe table name -> metric name
PROBE_METRIC = {
    "within_task_router": M.within_task_router_probe,
    "posterior": M.posterior_probe,
    "global_router": M.global_router_probe,
}
# the evaluate record columns the metrics read (evaluate.RECORD_COLUMNS has them all)
METRIC_RECORD_COLUMNS = [
    "cell_id",
    "task",
    "example_id",
    "strategy",
    "correct",
    "matched_strategies",
    "followed_strategy",
    "router_mu",
    "posterior_mu",
    "n_supervised",
    *LOSS_METRICS,
]
# what a cell's row records of the machine and code its evaluation and probes ran on
STAGE_PROVENANCE = ("host", "cpu", "cpu_capability", "code_hash")
# the reference stage's table (base.reference.TOKENS_COLUMNS) as token_base_relative_reconstruction reads it
REFERENCE_TOKEN_COLUMNS = ["task", "example_id", "split", "n_supervised", "b"]
PROVENANCE = [
    "code_version",
    "code_commit",
    "code_dirty",
    "code_hash",
    "torch_version",
    "started_at",
    "finished_at",
    "host",
    "cpu",
    "cpu_capability",
    "device",
    "wall_time_s",
    "tokens_per_s",
]


def _probe_summary(probes, name: str) -> dict:
    """Mean accuracy / chance / shuffled / chance-corrected over the probe's 'ok' rows (one per
    task, or the global row); NaN when none is ok. `<metric>_tasks` counts the ok rows and
    `<metric>_task_list` names them; `<metric>_collapsed_tasks` counts the rows with nothing to
    probe because the cell's generations there follow one strategy (status na, fewer than 2
    classes): a collapse, whose router information is 0, not a probe that failed."""
    m = PROBE_METRIC[name]
    rows = probes[probes["probe"] == name]
    ok = rows[rows["status"] == "ok"]
    collapsed = {f"{m}_collapsed_tasks": int(((rows["status"] == "na") & (rows["n_classes"] < 2)).sum())}
    if ok.empty:
        return collapsed | {
            m: math.nan,
            f"{m}_chance": math.nan,
            f"{m}_shuffled": math.nan,
            f"{m}_corrected": math.nan,
            f"{m}_tasks": 0,
            f"{m}_task_list": "",
        }
    return collapsed | {
        m: float(ok["accuracy"].mean()),
        f"{m}_chance": float(ok["chance"].mean()),
        f"{m}_shuffled": float(ok["shuffled_accuracy"].mean()),
        f"{m}_corrected": float(ok["corrected"].mean()),
        f"{m}_tasks": int(len(ok)),
        f"{m}_task_list": ",".join(sorted(ok["task"])),
    }


def _information_summary(probes, name: str = M.router_information) -> dict:
    """An information probe's metric (router_information, router_mu_information): the mean over
    tasks of its rows' `information` (every task has one: a task where z says nothing reads 0,
    never NA, so both arms of a contrast average over the same tasks); `_tasks` counts them and
    `_task_list` names them. NaN without rows (a probe table written before the probe)."""
    ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
    return {
        name: float(ok["information"].astype(float).mean()) if len(ok) else math.nan,
        f"{name}_tasks": int(len(ok)),
        f"{name}_task_list": ",".join(sorted(ok["task"])),
    }


def endpoint_decomposition(records, probes) -> dict:
    """router_information taken apart, per task t of the records, then the mean over tasks:

    - single_strategy_share s_t: the share of the task's generations that follow exactly one
      strategy (m_t of n_t; strategy_match_rate counts those that match one or more);
    - followed_strategy_entropy h_t: the entropy (bits) of the strategies those m_t follow;
    - router_information_of_followed r_t = (sum of the task's oof bits / m_t) / h_t: what z tells
      about the followed strategy relative to the mix the cell actually follows (0 = nothing,
      1 = z fixes it); NaN where h_t = 0 (one strategy followed: nothing to tell), and the cell's
      value is the mean over the tasks where it is defined (NaN when none is).

    Per task the parts multiply back exactly: I_t = s_t * r_t * h_t / H_t, with H_t the entropy of
    the data's strategy mix (`strategy_entropy`, the same in every cell evaluated on the test
    inputs), and I_t = 0 where h_t = 0. The cell's router_information is the mean over tasks of
    that product, so it equals the product of the three means over H only when the parts do not
    vary across tasks: read the means for which part moved, not as factors that multiply."""
    info = probes[(probes["probe"] == M.router_information) & (probes["status"] == "ok")].set_index("task")
    shares, entropies, rhos = [], [], []
    for task, g in records.groupby("task", sort=True):
        followed = g["followed_strategy"].dropna()
        m = len(followed)
        h = entropy_bits(followed) if m else 0.0
        shares.append(m / len(g))
        entropies.append(h)
        if task in info.index and m and h > 0:
            rhos.append(float(np.sum(np.asarray(info.loc[task, "oof_bits"], dtype=float))) / m / h)
    return {
        M.single_strategy_share: float(np.mean(shares)) if shares else math.nan,
        M.followed_strategy_entropy: float(np.mean(entropies)) if entropies else math.nan,
        M.router_information_of_followed: float(np.mean(rhos)) if rhos else math.nan,
    }


def reference_sums(tokens: pd.DataFrame) -> dict:
    """What token_base_relative_reconstruction needs from the reference stage's tokens table
    (`tokens.parquet`): per test example (task, example_id) its n_supervised and the entangled
    model's summed NLL sum_t b_it (`b_sum`), and n_bar, the mean n_supervised over train (the
    `sum_scaled` aggregation's divisor, as objective.aggregate_tokens)."""
    test = tokens[tokens["split"] == "test"]
    train = tokens[tokens["split"] == "train"]
    keys = list(zip(test["task"], test["example_id"].astype(str)))
    return {
        "b_sum": dict(zip(keys, (float(np.sum(np.asarray(b, dtype=float))) for b in test["b"]))),
        "n_supervised": dict(zip(keys, test["n_supervised"].astype(int))),
        "n_bar": float(train["n_supervised"].mean()) if len(train) else math.nan,
    }


def summed_nll(records, aggregation: str, n_bar: float = math.nan) -> np.ndarray:
    """Per example, the cell's summed test NLL sum_t l_it, undoing the aggregation of its
    `reconstruction_loss` A_i(l) = sum_t l_it / d_i: times the declared divisor d_i
    (latentstrat.aggregations: n_supervised under `mean`, 1 under `sum`, n_bar under `sum_scaled`)."""
    raw = records[M.reconstruction_loss].astype(float).to_numpy()
    return raw * declared_aggregation(aggregation).divisor(records["n_supervised"].astype(float).to_numpy(), n_bar)


def reference_b_sum(records, reference: dict) -> np.ndarray:
    """Per record, the entangled model's summed NLL of the same example (reference_sums), checked
    against the record's n_supervised."""
    out = np.empty(len(records))
    for i, (t, e, n) in enumerate(zip(records["task"], records["example_id"].astype(str), records["n_supervised"])):
        if (t, e) not in reference["b_sum"]:
            raise ValueError(f"reference tokens have no test row for example {e!r} (task {t}): stale reference stage?")
        if int(reference["n_supervised"][(t, e)]) != int(n):
            raise ValueError(
                f"reference tokens: example {e!r} (task {t}) has n_supervised={reference['n_supervised'][(t, e)]}, "
                f"the evaluate records {n}"
            )
        out[i] = reference["b_sum"][(t, e)]
    return out


def token_base_relative(records, aggregation: str, reference: dict | None) -> float:
    """token_base_relative_reconstruction: sum over the test examples and their supervised tokens of
    the cell's NLL over the same sum of the entangled model's b, whatever the cell's aggregation
    (base_relative_reconstruction is token-weighted under `sum` and example-weighted under `mean`).
    NaN without the reference stage's sums."""
    if reference is None:
        return math.nan
    return float(summed_nll(records, aggregation, reference["n_bar"]).sum() / reference_b_sum(records, reference).sum())


def active_units(records) -> int:
    """Latent dimensions whose posterior mean minus router mean varies across the test inputs by
    more than ACTIVE_UNIT_VARIANCE (population variance): what z carries beyond what x decides."""
    d = np.stack(
        [np.asarray(q, float) - np.asarray(r, float) for q, r in zip(records["posterior_mu"], records["router_mu"])]
    )
    return int((d.var(axis=0) > ACTIVE_UNIT_VARIANCE).sum())


def followed_strategy_tv(records) -> tuple[float, float]:
    """(mean, max) over tasks of the total variation between the strategies the generations
    followed (those matching exactly one) and the true strategies of the same test examples:
    0 when the cell follows the data's mix, near 1 - 1/k when it collapses onto one strategy."""
    tvs = []
    for _, g in records.groupby("task", sort=True):
        followed = g["followed_strategy"].dropna()
        if followed.empty:
            tvs.append(1.0)  # nothing follows a strategy: as far from the data as it gets
            continue
        p = followed.value_counts(normalize=True)
        q = g["strategy"].value_counts(normalize=True)
        keys = set(p.index) | set(q.index)
        tvs.append(0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys))
    return (float(sum(tvs) / len(tvs)), float(max(tvs))) if tvs else (math.nan, math.nan)


def shared_task_gap(probes) -> float:
    """posterior - within-task router probe accuracy, averaged over the tasks where both probes
    ran: two means over different task sets would compare different tasks."""
    ok = probes[probes["status"] == "ok"]
    post = ok[ok["probe"] == "posterior"].set_index("task")["accuracy"]
    router = ok[ok["probe"] == "within_task_router"].set_index("task")["accuracy"]
    shared = sorted(set(post.index) & set(router.index))
    return float((post[shared] - router[shared]).mean()) if shared else math.nan


def _repeat_bits(pr) -> np.ndarray:
    """[repeats, probed examples] bits of an information probe row: its `oof_bits_repeats`, or
    its `oof_bits` as one repeat (a table written before the repeats, or a hand-made one)."""
    reps = pr.get("oof_bits_repeats")
    if reps is not None and not (np.isscalar(reps) and pd.isna(reps)) and len(reps):
        return np.stack([np.asarray(r, dtype=float) for r in reps])
    return np.asarray(pr["oof_bits"], dtype=float)[None, :]


def information_replicates(
    probes, by_task: dict, C: dict, n_boot: int, name: str = M.router_information, frozen: bool = False
) -> np.ndarray:
    """[n_boot] replicates of an information metric (router_information, router_mu_information):
    per task, the resampled test examples' bits (0 for those the probe did not see) summed, over
    the number drawn and the task's strategy entropy (the data's, fixed); mean over tasks.

    The probe's own variance: replicate j takes its bits from one repeat of the probe's CV,
    repeat j mod R (R = `probes.information_repeats`: R fold splits, the probe refitted on each),
    not from their mean. The replicates then spread by the test-input resampling and by how much
    the task's estimate moves between fold splits and refits; the frozen mean bits (`frozen=True`,
    the interval before the repeats) carry the first only, and their interval is too narrow where
    the estimate depends on the split (few examples, a weak signal, an L2 strength the inner CV
    picks differently per split). The mixture is centred on the cell's value (the mean of the
    per-repeat estimates is the estimate from the mean bits). It keeps each repeat's full spread
    rather than the spread of a mean of R repeats: the repeats refit on the same examples, so
    averaging them removes the fold-assignment noise of one split but not the probe's
    training-sample noise, which the between-split spread stands in for (on the wide side). With
    R = 1 the replicates equal the frozen ones exactly. The draws stay paired across cells: the
    same resampled test examples (resample_counts) and the same repeat index per replicate."""
    ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
    pick = np.arange(n_boot)
    per_task = []
    for _, pr in ok.iterrows():
        ids = by_task[pr["task"]]["example_id"].astype(str).to_numpy()
        pos_of = {e: i for i, e in enumerate(ids)}
        pos = np.array([pos_of[str(e)] for e in pr["example_ids"]], dtype=int)
        reps = _repeat_bits(pr)
        if frozen:
            reps = reps.mean(axis=0, keepdims=True)
        bits = np.zeros((len(reps), len(ids)))
        bits[:, pos] = reps
        w = C[pr["task"]]
        sums = w @ bits.T  # [n_boot, R]
        per_task.append(sums[pick, pick % len(reps)] / w.sum(1) / float(pr["strategy_entropy"]))
    return np.mean(per_task, axis=0) if per_task else np.full(n_boot, np.nan)


def bootstrap_replicates(
    records, probes, n_boot: int = N_BOOT, seed: int = BOOT_SEED, aggregation: str | None = None, reference=None
):
    """[n_boot, metric] replicates of the cell's test metrics (BOOTSTRAP_METRICS), test examples
    resampled within task. Probe accuracies resample the probes' out-of-fold predictions (the
    probes are not refit: the interval covers test-set sampling, not refitting); a replicate's
    chance level is its majority-class share, so the chance-corrected values move with it. The
    information metrics carry the probe's variance too (information_replicates).
    token_base_relative_reconstruction needs the cell's `aggregation` and the `reference` sums
    (reference_sums); NaN without them."""
    tasks = sorted(records["task"].unique())
    by_task = {t: records[records["task"] == t] for t in tasks}
    C = resample_counts({t: len(g) for t, g in by_task.items()}, n_boot, seed)
    N = sum(len(g) for g in by_task.values())
    rep = {}

    def mean_of(values_by_task):
        return sum(C[t] @ np.asarray(v, dtype=float) for t, v in values_by_task.items()) / N

    for name in INFORMATION_PROBES:
        rep[name] = information_replicates(probes, by_task, C, n_boot, name)
    if reference is not None and aggregation is not None:
        num = {t: summed_nll(g, aggregation, reference["n_bar"]) for t, g in by_task.items()}
        den = {t: reference_b_sum(g, reference) for t, g in by_task.items()}
        rep[M.token_base_relative_reconstruction] = sum(C[t] @ num[t] for t in tasks) / sum(
            C[t] @ den[t] for t in tasks
        )
    else:
        rep[M.token_base_relative_reconstruction] = np.full(n_boot, np.nan)
    rep[M.final_answer_accuracy] = mean_of({t: g["correct"].astype(bool) for t, g in by_task.items()})
    rep[M.strategy_match_rate] = mean_of({t: g["matched_strategies"].map(len).gt(0) for t, g in by_task.items()})
    for m in LOSS_METRICS:
        rep[m] = mean_of({t: g[m].astype(float) for t, g in by_task.items()})
    per_task = {}
    for name in ("within_task_router", "posterior"):
        accs, corrs = {}, {}
        ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
        for _, pr in ok.iterrows():
            t = pr["task"]
            pos_of = {e: i for i, e in enumerate(by_task[t]["example_id"].astype(str))}
            pos = np.array([pos_of[str(e)] for e in pr["example_ids"]], dtype=int)
            if len(pos) == 0:
                continue
            w = C[t][:, pos]  # [B, n_probe]
            total = w.sum(1)
            with np.errstate(invalid="ignore", divide="ignore"):
                acc = (w @ np.asarray(pr["oof_correct"], dtype=float)) / total
                labels = np.asarray(pr["labels"]).astype(str)
                chance = np.max([w[:, labels == c].sum(1) for c in np.unique(labels)], axis=0) / total
                corr = np.where(chance < 1, (acc - chance) / (1 - chance), np.nan)
            accs[t], corrs[t] = acc, corr
        per_task[name] = accs
        m = PROBE_METRIC[name]
        stack = lambda d: np.nanmean(np.stack(list(d.values())), axis=0) if d else np.full(n_boot, np.nan)  # noqa: E731
        with np.errstate(invalid="ignore"):
            rep[m], rep[f"{m}_corrected"] = stack(accs), stack(corrs)
    rep[M.matched_router_score] = rep[M.within_task_router_probe] * rep[M.strategy_match_rate]
    shared = sorted(set(per_task["posterior"]) & set(per_task["within_task_router"]))
    rep[M.posterior_router_probe_gap] = (
        np.nanmean([per_task["posterior"][t] - per_task["within_task_router"][t] for t in shared], axis=0)
        if shared
        else np.full(n_boot, np.nan)
    )
    return pd.DataFrame({m: rep[m] for m in BOOTSTRAP_METRICS})


def cell_row(cell: Cell | dict, records, probes, reference: dict | None = None) -> dict:
    """One cell's metrics row from its evaluate records and probe tables (design section 6, docs/design.md).

    final_answer_accuracy = mean correct; strategy_match_rate = share of generations matching
    >= 1 strategy; probes = means over tasks of the 'ok' per-task probes (global: its row);
    losses = means of the per-example losses; router_information's parts (endpoint_decomposition);
    token_base_relative_reconstruction from the `reference` sums (reference_sums; NaN without);
    derived metrics by `derive`.
    """
    cell = as_cell(cell)
    s = cell.settings
    row = {
        "cell_id": cell.cell_id,
        "arm": cell.arm,
        "role": cell.role,
        **{k: s[k] for k in CELL_KEYS},
        "family_label": s.reconstruction_family.label,
        "beta_label": beta_label(s.beta),
    }
    row[M.final_answer_accuracy] = float(records["correct"].astype(bool).mean())
    row[M.strategy_match_rate] = float(records["matched_strategies"].map(len).gt(0).mean())
    for name in LOSS_METRICS:
        row[name] = float(records[name].astype(float).mean())
    for name in INFORMATION_PROBES:
        row.update(_information_summary(probes, name))
    row.update(endpoint_decomposition(records, probes))
    row[M.token_base_relative_reconstruction] = token_base_relative(records, s.token_aggregation.name, reference)
    for name in PROBE_METRIC:
        row.update(_probe_summary(probes, name))
    row[M.active_units] = active_units(records)
    row[M.posterior_router_probe_gap] = shared_task_gap(probes)
    row["followed_strategy_tv"], row["followed_strategy_tv_max"] = followed_strategy_tv(records)
    row = derive(row)
    row["n_test"] = int(len(records))
    row["n_tasks"] = int(records["task"].nunique())
    first = ["cell_id", "arm", "role", *CELL_KEYS, "family_label", "beta_label", *METRICS]
    return {k: row[k] for k in first + [k for k in row if k not in first]}


def write_cell_row(
    cell: Cell | dict,
    records_path,
    probe_paths,
    out_path,
    bootstrap_path=None,
    train_summary_path=None,
    reference_tokens_path=None,
):
    """Check that records and probe tables belong to `cell` and cover its tasks, then write
    the one-row row.parquet (with 95% bootstrap intervals, `<metric>_ci_low/_ci_high`) and
    the bootstrap replicates (bootstrap.parquet beside it, or `bootstrap_path`). Returns the row
    as a DataFrame. `reference_tokens_path`: the reference stage's tokens.parquet, which
    token_base_relative_reconstruction needs (NaN without it)."""
    records = read_parquet(records_path, "evaluate records", columns=METRIC_RECORD_COLUMNS)
    if records.empty:
        raise ValueError(f"evaluate records {records_path} have no rows")
    cell = as_cell(cell)
    cid = cell.cell_id
    other = sorted(set(records["cell_id"]) - {cid})
    if other:
        raise ValueError(f"evaluate records {records_path} belong to cell {other[0]!r}, not {cid!r}")
    probes = read_probes(probe_paths)
    other = sorted(set(probes["cell_id"]) - {cid})
    if other:
        raise ValueError(f"probe tables {[str(p) for p in probe_paths]} include cell {other[0]!r}, not {cid!r}")
    for name, task_set in (
        ("within_task_router", set(records["task"])),
        (M.router_information, set(records["task"])),
        ("posterior", set(records["task"])),
        ("global_router", {"global"}),
    ):
        missing = sorted(task_set - set(probes.loc[probes["probe"] == name, "task"]))
        if missing:
            raise ValueError(f"probe tables {[str(p) for p in probe_paths]} lack the {name} probe of {missing}")
    reference = None
    if reference_tokens_path is not None:
        tokens = read_parquet(reference_tokens_path, "reference tokens", columns=REFERENCE_TOKEN_COLUMNS)
        reference = reference_sums(tokens)
    row = cell_row(cell, records, probes, reference)
    if train_summary_path is not None:  # provenance: the code, host and times the cell trained with
        summary = json.loads(Path(train_summary_path).read_text())
        row.update({f"train_{k}": summary.get(k) for k in PROVENANCE})
        # every machine the cell trained on (a resumed cell may have moved): JSON, one segment each
        row["train_hosts"] = json.dumps(summary["hosts"]) if "hosts" in summary else None
    # where the evaluation and the probes ran (their tables' metadata; None where not recorded)
    probe_prov = parquet_provenance(read_parquet(probe_paths[0], "probe table")) if len(probe_paths) else {}
    for stage, prov in (("evaluate", parquet_provenance(records)), ("probes", probe_prov)):
        row.update({f"{stage}_{k}": prov.get(k) for k in STAGE_PROVENANCE})
    reps = bootstrap_replicates(records, probes, aggregation=cell.settings.token_aggregation.name, reference=reference)
    for m in BOOTSTRAP_METRICS:
        row[f"{m}_ci_low"], row[f"{m}_ci_high"] = interval(reps[m])
    df = pd.DataFrame([row])
    write_parquet(reps.astype("float32"), bootstrap_path or Path(out_path).with_name(BOOTSTRAP_FILE))
    write_parquet(df, out_path)
    return df


def run(job: Job) -> None:
    """The tabulate rule's job: the cell's row and its bootstrap replicates."""
    write_cell_row(
        job.cell,
        job.input["records"],
        job.files("probes"),
        job.output["row"],
        job.output["bootstrap"],
        train_summary_path=job.input["summary"],
        reference_tokens_path=job.input["reference_tokens"],
    )
