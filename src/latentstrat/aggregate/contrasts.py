"""Setting rows of the primary arm against each comparison arm: common cells (paired settings
with deltas and their 95% intervals), the arm contrasts with their verdicts (training noise in
every interval, measured on the paired delta: `training_terms`; a sign-flip test beside it), the
contrast per reconstruction family (`family_contrasts`), and the inferred z-free reference scale
of each arm on those cells (`scale_table`). Their error rates are measured by simulation through
this code (`python -m latentstrat.bench calibrate`, docs/design.md "Verdicts").

A comparison arm is run here or read from an external comparison summary table (columns in
docs/comparison-table.md). Deltas are primary minus comparison arm.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latentstrat.aggregate import power
from latentstrat.aggregate.columns import DELTA_METRICS, FAMILY_COL
from latentstrat.aggregate.hosts import pair_host_check, seed_order
from latentstrat.aggregate.power import combine_terms
from latentstrat.aggregate.settings import setting_replicates
from latentstrat.cells import CELL_KEYS, format_value
from latentstrat.metrics import M, interval

Z95 = 1.959963984540054
# the primary endpoint and the seeds' router score: a delta of these between cells that carry no
# strategy information compares noise with noise
ROUTER_SCORES = (M.router_information, M.matched_router_score)
CONTRAST_COLUMNS = [
    "comparison_arm",
    "metric",
    "n_cells",
    "mean_delta",
    "ci_low",
    "ci_high",
    "verdict",
    "why",
    "alpha",
    "detectable_delta",
    "training_noise_in_interval",
    "se",
    "interval_df",
    "se_test",
    "se_training",
    "training_noise_sd",
    "training_noise_df",
    "training_noise_settings",
    "training_noise_strata",
    "sign_flip_p",
    "sign_flip_joint",
    "test_ci_low",
    "test_ci_high",
    "seeds_min",
    "seeds_max",
    "strategy_cells",
    "both_empty_cells",
    "cells_negative",
    "cells_positive",
    "cells_cannot_tell",
]
# the heterogeneity table (family_contrasts): a contrast over one family's settings / all the others'
FAMILY_CONTRAST_COLUMNS = [
    "comparison_arm",
    "metric",
    FAMILY_COL,
    "part",
    "n_cells",
    "mean_delta",
    "ci_low",
    "ci_high",
    "verdict",
    "why",
    "training_noise_in_interval",
    "sign_flip_p",
]


def pair_keys(primary: pd.DataFrame, comparison: pd.DataFrame, grid_axes) -> list[str]:
    """Keys that pair a primary row with a comparison row: the grid axes except aggregation."""
    return [k for k in grid_axes if k != "token_aggregation" and k in primary.columns and k in comparison.columns]


def pair_key(row, keys) -> tuple:
    return tuple(format_value(row[k]) for k in keys)


def arm_prefix(primary: pd.DataFrame, comparison: pd.DataFrame) -> tuple[str, str]:
    """Column prefixes: the arms' token aggregations (mean_/sum_) when they differ, else primary_/comparison_."""
    pa = set(primary["token_aggregation"]) if len(primary) else set()
    ca = set(comparison["token_aggregation"]) if len(comparison) else set()
    if len(pa) == 1 and len(ca) == 1 and pa != ca:
        return pa.pop(), ca.pop()
    return "primary", "comparison"


def row_se(row, m: str) -> float:
    """A row's standard error of metric m over test inputs when no replicates are at hand: from its
    95% interval (`<m>_ci_low/_ci_high`, normal approximation); NaN when it has none."""
    lo, hi = row.get(f"{m}_ci_low", math.nan), row.get(f"{m}_ci_high", math.nan)
    if pd.notna(lo) and pd.notna(hi):
        return (float(hi) - float(lo)) / (2 * Z95)
    return math.nan


def n_seeds(row) -> int:
    n = row.get("n_seeds", 1)
    return int(n) if pd.notna(n) else 1


# ----------------------------------------------------------------------------- training noise
#
# The design this estimator rests on (docs/design.md, "Verdicts"): every cell trains with its own
# seed (cells.training_seed, from its settings and its replicate seed) and the two cells of a pair
# with the same one. Settings are then independent draws, and a setting's training noise is
# measured on the paired delta itself: the spread of primary minus comparison across its
# replicate seeds. A setting with one replicate borrows the pooled spread of the replicated
# settings of its stratum: the same KL weight and the same state (`stratum_of`), since a KL
# weight sets how far a seed moves the latent; a stratum with no replicated setting leaves the
# training noise unknown.


def stratum_of(primary_state: str, comparison_state: str) -> str:
    """A setting's training-noise stratum: `empty` when every cell of both arms is `empty` (z
    unused on either side: the paired delta moves by test-input noise only), `used` when cell
    states are known and any cell uses z, `all` when states are unknown (external tables)."""
    if not primary_state or not comparison_state or "unknown" in (primary_state + comparison_state):
        return "all"
    return "empty" if primary_state == comparison_state == "empty" else "used"


def seed_values(row, m: str, cells: dict | None) -> list[tuple[str, float]]:
    """(replicate seed, value of m) of each cell of a setting row; [] when its cells are not at hand
    (`cells`: cell id -> that cell's metrics row)."""
    if not cells:
        return []
    ids = [i for i in str(row.get("cell_ids", row.get("cell_id", ""))).split(",") if i]
    out = []
    for i in ids:
        r = cells.get(i)
        if r is None:
            return []
        v = r.get(m, math.nan)
        out.append((format_value(r.get("seed", "")), float(v) if pd.notna(v) else math.nan))
    return out


def paired_seed_deltas(pv: list, cv: list) -> list[float] | None:
    """Primary minus comparison value per replicate: cells with the same replicate seed pair up
    (they trained with the same seed); arms with seeds of their own (an A/A arm) pair by replicate
    order. None when the arms have different numbers of replicates (or none)."""
    if not pv or len(pv) != len(cv):
        return None
    if {s for s, _ in pv} == {s for s, _ in cv}:
        c = dict(cv)
        return [v - c[s] for s, v in pv]
    return [
        a - b
        for (_, a), (_, b) in zip(
            sorted(pv, key=lambda t: seed_order(t[0])), sorted(cv, key=lambda t: seed_order(t[0]))
        )
    ]


def setting_training(p, c, m: str, cells: dict | None) -> dict:
    """The training noise of one setting's mean delta from its own replicates:
    {var: variance of the setting's mean delta, df, seed_var: variance of one replicate's delta}.
    - paired (k >= 2 replicates in both arms, cells at hand): var(d_r) / k on k - 1 df;
    - unpaired (>= 2 seeds in both arms, only their SDs known): s_p^2 / k_p + s_c^2 / k_c, Welch df;
    - else unreplicated: NaN (its stratum's pooled spread stands in: `stratum_pools`)."""
    d = paired_seed_deltas(seed_values(p, m, cells), seed_values(c, m, cells))
    if d is not None and len(d) >= 2 and all(math.isfinite(x) for x in d):
        k, sv = len(d), float(np.var(d, ddof=1))
        return {"var": sv / k, "df": float(k - 1), "seed_var": sv}
    kp, kc = n_seeds(p), n_seeds(c)
    sp, sc = p.get(f"{m}_std", math.nan), c.get(f"{m}_std", math.nan)
    if kp >= 2 and kc >= 2 and pd.notna(sp) and pd.notna(sc):
        a, b = float(sp) ** 2 / kp, float(sc) ** 2 / kc
        df = (a + b) ** 2 / (a**2 / (kp - 1) + b**2 / (kc - 1)) if a + b > 0 else float(kp + kc - 2)
        return {"var": a + b, "df": df, "seed_var": float(sp) ** 2 + float(sc) ** 2}
    return {"var": math.nan, "df": math.nan, "seed_var": math.nan}


def pool_of(r) -> str:
    """The training-noise stratum a setting row borrows from: its state stratum at its KL weight
    (`used at beta=1`); the state stratum alone for rows that name no KL weight."""
    beta = r.get("beta_label") if hasattr(r, "get") else None
    return f"{r['stratum']} at {beta}" if isinstance(beta, str) and beta else str(r["stratum"])


def stratum_pools(c: pd.DataFrame, m: str) -> dict:
    """stratum (pool_of) -> {seed_var, df, settings}: the replicated settings' per-replicate
    delta variances pooled with their degrees of freedom, per stratum; a stratum with none is
    absent."""
    col = f"delta_{m}"
    if c.empty or f"{col}_seed_var" not in c.columns:
        return {}
    out = {}
    ok = c[c[f"{col}_seed_var"].notna() & c[col].notna()]
    if ok.empty:
        return {}
    for stratum, g in ok.groupby(pd.Series([pool_of(r) for _, r in ok.iterrows()], index=ok.index), sort=False):
        df = float(g[f"{col}_train_df"].sum())
        if df > 0:
            seed_var = float((g[f"{col}_train_df"] * g[f"{col}_seed_var"]).sum()) / df
            out[stratum] = {"seed_var": seed_var, "df": df, "settings": len(g)}
    return out


def _borrowed_factor(r) -> float:
    """A setting's mean-delta variance in units of one replicate's delta variance: (1/k_p + 1/k_c) / 2."""
    return (1 / r.primary_n_seeds + 1 / r.comparison_n_seeds) / 2


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile (the normal one for infinite df)."""
    from scipy import stats

    return float(stats.norm.ppf(q) if not math.isfinite(df) else stats.t.ppf(q, df))


def interval_with_noise(d: float, se_test: float, var_training: float, df_training: float):
    """(low, high, SE, df) of the 95% t interval of estimate d with the test inputs' noise and one
    training term."""
    se, df = combine_terms(se_test, [(var_training, df_training)])
    half = t_quantile(0.975, df) * se
    return d - half, d + half, se, df


JOINT_MIN_SETTINGS = 6  # the fewest settings whose plain sign flips can reach 0.05 (2 / 2^6)


def sign_flip_p(deltas, boot=None, draws: int = 20000) -> float:
    """Two-sided p-value of the sign-flip (randomization) test of mean delta = 0 over the
    settings' paired deltas: a diagnostic beside the verdict, not part of it (docs/design.md,
    Randomization diagnostic).

    Without `boot`: the share of the 2^n sign assignments whose |mean| reaches the observed one
    (all of them up to 16 settings, else `draws` drawn with a fixed seed); it needs no variance
    model, only that each setting's delta is as likely + as - under no difference, independently
    of the others. Its smallest p-value is 2 / 2^n (n <= 5 settings can never reach 0.05).

    With `boot` (the paired bootstrap's replicates of the mean delta, every cell resampling the
    same test inputs) and at least JOINT_MIN_SETTINGS settings: the settings share their test
    inputs, so a draw of test inputs that suits one arm moves every setting's delta at once, a
    shift no sign assignment reproduces (the plain test then rejects far too often). A null draw
    is then a sign assignment of the settings' deltas about their mean (what varies setting by
    setting) plus one bootstrap draw of the test inputs (the replicate minus the replicates'
    mean: what moves them together), and the statistic is studentized, the mean over its own SE
    (the flipped deltas' spread over n plus the bootstrap's variance), draw by draw: where the
    arms' spreads differ the deltas are not exchangeable in sign, and the raw mean's null then
    rejects too often (10% at 0.05, measured) while the studentized one holds closer to its
    level. `draws` pairs with a fixed seed."""
    d = np.asarray([x for x in deltas if pd.notna(x)], dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    rng = np.random.default_rng(0)
    b = np.asarray([x for x in (boot if boot is not None else []) if np.isfinite(x)], dtype=float)
    if len(b) >= 2 and n >= JOINT_MIN_SETTINGS:
        var_b = float(b.var(ddof=1))
        t_obs = observed / math.sqrt(d.var(ddof=1) / n + var_b)
        x = rng.choice([-1, 1], (draws, n)) * (d - d.mean())
        null = x.mean(axis=1) + rng.choice(b - b.mean(), draws)
        t_null = np.abs(null) / np.sqrt(x.var(axis=1, ddof=1) / n + var_b)
        return float(np.mean(t_null >= t_obs - 1e-12))
    if n <= 16:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
    else:
        signs = rng.choice([-1, 1], (draws, n))
    return float(np.mean(np.abs(signs @ d) / n >= observed - 1e-12))


# ----------------------------------------------------------------------------- common cells


def delta_test(p, c, m: str, pr, cr) -> tuple[float, float, float]:
    """(low, high, SE) over test inputs of primary row p minus comparison row c in metric m: the
    paired bootstrap of their replicates (pr, cr: setting_replicates) when both have them, else
    each side's own interval (row_se); NaN when neither."""
    pv, cv = float(p.get(m, math.nan)), float(c.get(m, math.nan))
    if pr is not None and cr is not None and m in pr[1] and m in cr[1]:
        reps = pr[0][:, pr[1].index(m)] - cr[0][:, cr[1].index(m)]
        lo, hi = interval(reps)
        return lo, hi, float(np.nanstd(reps, ddof=1))
    se = math.hypot(row_se(p, m), row_se(c, m))
    if math.isfinite(se):
        return pv - cv - Z95 * se, pv - cv + Z95 * se, se
    return math.nan, math.nan, math.nan


def _states_of(row, states: dict | None) -> str:
    """The states of a setting row's cells ('strategy', or 'empty,strategy' when its seeds differ)."""
    if not states:
        return ""
    ids = [i for i in str(row.get("cell_ids", row.get("cell_id", ""))).split(",") if i]
    return ",".join(sorted({states[i] for i in ids if i in states}))


def _setting_intervals(out: pd.DataFrame, metrics) -> None:
    """Each common setting's delta interval: test inputs plus its training noise (its own
    replicates', else its stratum's pooled spread); the test inputs' alone when neither is known
    (the per-setting verdicts then read cannot tell)."""
    for m in metrics:
        col = f"delta_{m}"
        if col not in out.columns:
            continue
        pools = stratum_pools(out, m)
        lo, hi, known = [], [], []
        for _, r in out.iterrows():
            var, df = r[f"{col}_train_var"], r[f"{col}_train_df"]
            pool = pools.get(pool_of(r))
            if pd.isna(var) and pool:
                var, df = pool["seed_var"] * _borrowed_factor(r), pool["df"]
            if pd.notna(var) and pd.notna(r[col]) and math.isfinite(r[f"{col}_se_test"]):
                a, b, _, _ = interval_with_noise(float(r[col]), float(r[f"{col}_se_test"]), float(var), float(df))
                lo.append(a), hi.append(b), known.append(True)
            else:
                lo.append(r[f"{col}_ci_low"]), hi.append(r[f"{col}_ci_high"]), known.append(False)
        out[f"{col}_ci_low"], out[f"{col}_ci_high"], out[f"{col}_noise_known"] = lo, hi, known


def common_cells(
    primary: pd.DataFrame,
    comparison: pd.DataFrame,
    grid_axes,
    arm: str,
    metrics=DELTA_METRICS,
    bootstrap: dict | None = None,
    cells: dict | None = None,
    states: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(common rows with comparison/primary values and deltas, primary rows without a match).

    Rows are setting-level (seed means). Delta = primary - comparison, with its test-input SE
    (`delta_<m>_se_test`: the paired bootstrap over test inputs, the replicates resampling the
    same test examples in both cells, metrics.resample_counts), its training noise from its own
    replicates (`_train_var`, `_train_df`, `_seed_var`: setting_training; `cells`: cell id -> metrics
    row) and its 95% interval with both (`_ci_low/_ci_high`). `states`: cell id -> cell state,
    shown per side and deciding the setting's stratum (stratum_of).
    """
    keys = pair_keys(primary, comparison, grid_axes)
    p_pre, c_pre = arm_prefix(primary, comparison)
    comparison_index = {}
    for _, c in comparison.iterrows():
        comparison_index.setdefault(pair_key(c, keys), c)
    rows, unmatched = [], []
    for _, p in primary.iterrows():
        c = comparison_index.get(pair_key(p, keys))
        ident = {FAMILY_COL: p["family_label"], "beta_label": p["beta_label"]}
        if c is None:
            unmatched.append(
                {
                    "comparison_arm": arm,
                    **ident,
                    "primary_cell": p.get("cell_id", p.get("cell_ids")),
                    "reason": f"no {arm} row with " + ", ".join(f"{k}={format_value(p[k])}" for k in keys),
                }
            )
            continue
        row = {"comparison_arm": arm, **ident}
        row["primary_state"], row["comparison_state"] = _states_of(p, states), _states_of(c, states)
        row["stratum"] = stratum_of(row["primary_state"], row["comparison_state"])
        row["primary_n_seeds"], row["comparison_n_seeds"] = n_seeds(p), n_seeds(c)
        row["pair_host_mix"], row["pair_host_unknown"] = pair_host_check(p, c, cells)
        pr, cr = setting_replicates(p, bootstrap), setting_replicates(c, bootstrap)
        for m in metrics:
            cv, pv = float(c.get(m, math.nan)), float(p.get(m, math.nan))
            row[f"{c_pre}_{m}"], row[f"{p_pre}_{m}"], row[f"delta_{m}"] = cv, pv, pv - cv
            lo, hi, se_test = delta_test(p, c, m, pr, cr)
            row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"] = lo, hi
            row[f"delta_{m}_se_test"] = se_test
            tr = setting_training(p, c, m, cells)
            row[f"delta_{m}_train_var"], row[f"delta_{m}_train_df"] = tr["var"], tr["df"]
            row[f"delta_{m}_seed_var"] = tr["seed_var"]
            if f"{m}_std" in p.index and n_seeds(p) > 1:
                row[f"{p_pre}_{m}_std"] = p[f"{m}_std"]
        row["primary_cell"] = p.get("cell_ids", p.get("cell_id"))
        row["comparison_cell"] = c.get("cell_ids", c.get("cell_id"))
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        _setting_intervals(out, metrics)
        if not states:
            out = out.drop(columns=["primary_state", "comparison_state"])
    return out, pd.DataFrame(unmatched, columns=["comparison_arm", FAMILY_COL, "beta_label", "primary_cell", "reason"])


# ----------------------------------------------------------------------------- arm contrasts


def verdict(lo: float, hi: float) -> str:
    """The sign of an effect from its 95% interval: negative / positive when the interval
    excludes 0, else cannot tell (also when there is no interval)."""
    if pd.isna(lo) or pd.isna(hi):
        return "cannot tell"
    return "negative" if hi < 0 else ("positive" if lo > 0 else "cannot tell")


def mean_delta_test(c: pd.DataFrame, m: str, bootstrap: dict | None) -> tuple[float, float, float, np.ndarray | None]:
    """(low, high, SE, replicates) over test inputs of the mean over common cells c of delta m:
    from the cells' paired replicates (replicate by replicate; returned) when every cell has
    them, else, the cells being independent, from each delta's SE (no replicates); NaN when
    neither."""
    col = f"delta_{m}"
    reps = []
    for _, r in c.iterrows():
        pr = setting_replicates({"cell_ids": r.get("primary_cell", "")}, bootstrap)
        cr = setting_replicates({"cell_ids": r.get("comparison_cell", "")}, bootstrap)
        if pr is None or cr is None or m not in pr[1] or m not in cr[1]:
            reps = None
            break
        reps.append(pr[0][:, pr[1].index(m)] - cr[0][:, cr[1].index(m)])
    if reps:
        mean = np.nanmean(np.stack(reps), axis=0)
        return *interval(mean), float(np.nanstd(mean, ddof=1)), mean
    ok = c[col].notna() if col in c.columns else pd.Series(dtype=bool)
    ses = c.loc[ok, f"{col}_se_test"] if f"{col}_se_test" in c.columns else pd.Series(dtype=float)
    if ok.any() and ses.notna().all():
        se = math.sqrt(float((ses**2).sum())) / len(ses)
        mu = float(c.loc[ok, col].mean())
        return mu - Z95 * se, mu + Z95 * se, se, None
    return math.nan, math.nan, math.nan, None


def training_terms(ok: pd.DataFrame, m: str) -> tuple[list[tuple[float, float]], list[str], dict]:
    """The training-noise terms of the mean delta's variance (times n^2): one per replicated
    setting (its own paired spread), one per stratum for its unreplicated settings (the stratum's
    pooled spread, on the pool's df); the labels of unreplicated settings whose stratum has no
    replicated setting (training noise unknown there); and the pools."""
    col = f"delta_{m}"
    pools = stratum_pools(ok, m)
    terms, unknown, borrowed = [], [], {}
    for _, r in ok.iterrows():
        if pd.notna(r[f"{col}_train_var"]):
            terms.append((float(r[f"{col}_train_var"]), float(r[f"{col}_train_df"])))
        elif (key := pool_of(r)) in pools:
            borrowed[key] = borrowed.get(key, 0.0) + _borrowed_factor(r)
        else:
            unknown.append(f"{r[FAMILY_COL]} {r.beta_label}")
    terms += [(pools[s]["seed_var"] * f, pools[s]["df"]) for s, f in borrowed.items()]
    return terms, unknown, pools


def _why_unknown(n: int, unknown: list[str]) -> str:
    if not n:
        return "no common cell with a value on both sides"
    return (
        f"training noise unknown for {len(unknown)} of {n} settings ({', '.join(unknown[:4])}"
        + (", ..." if len(unknown) > 4 else "")
        + "): no replicated setting in their stratum, the same KL weight and state (add `replicates:` or seeds)"
    )


def contrast_row(arm: str, c: pd.DataFrame, m: str, bootstrap: dict | None, alpha: float = 0.05) -> dict:
    """One arm contrast: comparison arm `arm`, its common cells c, metric m, at level alpha (see
    arm_contrasts)."""
    col = f"delta_{m}"
    ok = c[c[col].notna()] if col in c.columns else c.iloc[0:0]
    n = len(ok)
    mean = float(ok[col].mean()) if n else math.nan
    t_lo, t_hi, se_test, boot = mean_delta_test(ok, m, bootstrap) if n else (math.nan, math.nan, math.nan, None)
    seeds = pd.concat([ok.primary_n_seeds, ok.comparison_n_seeds]) if n else pd.Series([1])
    terms, unknown, pools = training_terms(ok, m) if n else ([], [], {})
    known = n > 0 and not unknown and math.isfinite(se_test)
    train_var = sum(t for t, _ in terms) / n**2 if n else math.nan
    if known:
        se, df = combine_terms(se_test, [(t / n**2, d) for t, d in terms])
        half = t_quantile(1 - alpha / 2, df) * se
        lo, hi = mean - half, mean + half
        detect = power.detect_factor(df, alpha=alpha) * se
        v, why = verdict(lo, hi), ""
    else:
        se, df, (lo, hi), detect = se_test, math.inf, (t_lo, t_hi), power.detect_factor(math.inf, alpha=alpha) * se_test
        v = "cannot tell"
        why = (
            _why_unknown(n, unknown)
            if unknown or not n
            else "no test-input interval (no bootstrap replicates or intervals)"
        )
    replicated = ok[ok[f"{col}_seed_var"].notna()] if n else ok
    seed_sd = math.sqrt(float(replicated[f"{col}_seed_var"].mean())) if len(replicated) else math.nan
    t_df = combine_terms(0.0, terms)[1] if terms else math.nan
    states = [str(s) for col_s in ("primary_state", "comparison_state") if col_s in ok.columns for s in ok[col_s]]
    all_known = bool(states) and all(s and "unknown" not in s for s in states)
    strategy_cells = sum("strategy" in s for s in states) if all_known else None
    both_empty = int((ok.stratum == "empty").sum()) if n and all_known else None
    if m in ROUTER_SCORES and strategy_cells == 0 and n:
        v, why = "cannot tell", "no cell of either arm carries strategy information (no cell in state `strategy`)"
    each = (
        [
            verdict(a, b) if k else "cannot tell"
            for a, b, k in zip(ok[f"{col}_ci_low"], ok[f"{col}_ci_high"], ok[f"{col}_noise_known"])
        ]
        if n
        else []
    )
    return {
        "comparison_arm": arm,
        "metric": m,
        "n_cells": n,
        "mean_delta": mean,
        "ci_low": lo,
        "ci_high": hi,
        "verdict": v,
        "why": why,
        "alpha": alpha,
        "detectable_delta": detect,
        "training_noise_in_interval": bool(known),
        "se": se,
        "interval_df": df,
        "se_test": se_test,
        "se_training": math.sqrt(train_var) if known else math.nan,
        "training_noise_sd": seed_sd,
        "training_noise_df": t_df,
        "training_noise_settings": len(replicated),
        "training_noise_strata": ", ".join(f"{s}: {p['settings']} settings, {p['df']:g} df" for s, p in pools.items()),
        "sign_flip_p": sign_flip_p(ok[col], boot) if n else math.nan,
        "sign_flip_joint": boot is not None and int(ok[col].notna().sum()) >= JOINT_MIN_SETTINGS,
        "test_ci_low": t_lo,
        "test_ci_high": t_hi,
        "seeds_min": int(seeds.min()),
        "seeds_max": int(seeds.max()),
        "strategy_cells": strategy_cells,
        "both_empty_cells": both_empty,
        "cells_negative": each.count("negative"),
        "cells_positive": each.count("positive"),
        "cells_cannot_tell": each.count("cannot tell"),
    }


def arm_contrasts(commons: dict, bootstrap: dict | None, metrics=DELTA_METRICS, alpha: float = 0.05) -> pd.DataFrame:
    """Per comparison arm and metric: the mean common-setting delta (primary - arm), its t
    interval at level alpha (the look's: power.look_alpha) with the test inputs' noise (the paired
    bootstrap of the mean) and training noise (training_terms, Welch-Satterthwaite df), the
    verdict from it, the smallest difference it could detect (80% power at alpha, the same
    variance) and the sign-flip test's p-value over the settings' deltas. Where the training
    noise of some setting is unknown the verdict is `cannot tell` and the interval shown is the
    test inputs' alone. A router-score contrast in which no cell of either arm is in state
    `strategy` compares noise with noise: cannot tell, whatever its interval. Also how many
    single-setting deltas are negative / positive / cannot tell."""
    rows = [
        contrast_row(arm, c, m, bootstrap, alpha)
        for arm, c in commons.items()
        if c is not None and not c.empty
        for m in metrics
        if f"delta_{m}" in c.columns
    ]
    return pd.DataFrame(rows, columns=CONTRAST_COLUMNS)


def family_contrasts(commons: dict, bootstrap: dict | None, metric: str, alpha: float = 0.05) -> pd.DataFrame:
    """Heterogeneity of a contrast over reconstruction families, for `metric`: per comparison arm
    and family, the contrast over that family's settings alone (`only`) and over every other
    family's (`without`: leave one family out), each with its interval and verdict (contrast_row)."""
    rows = []
    for arm, c in commons.items():
        if c is None or c.empty or f"delta_{metric}" not in c.columns:
            continue
        for fam in c[FAMILY_COL].unique():
            for part, sub in (("only", c[c[FAMILY_COL] == fam]), ("without", c[c[FAMILY_COL] != fam])):
                if sub.empty:
                    continue
                r = contrast_row(arm, sub, metric, bootstrap, alpha)
                rows.append(
                    {
                        "comparison_arm": arm,
                        "metric": metric,
                        FAMILY_COL: fam,
                        "part": part,
                        **{k: r[k] for k in FAMILY_CONTRAST_COLUMNS[4:]},
                    }
                )
    return pd.DataFrame(rows, columns=FAMILY_CONTRAST_COLUMNS)


def differing_keys(p: pd.Series, c: pd.Series, ignore=("token_aggregation", "seed")) -> tuple[list[str], list[str]]:
    """(cell keys recorded on both rows whose values differ, cell keys the comparison does not record)."""
    diff, unknown = [], []
    for k in CELL_KEYS:
        if k in ignore:
            continue
        if k not in c.index or pd.isna(c[k]):
            unknown.append(k)
        elif k in p.index and format_value(p[k]) != format_value(c[k]):
            diff.append(k)
    return diff, unknown
