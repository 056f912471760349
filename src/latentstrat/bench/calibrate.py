"""Calibration of the verdict: its error rate measured by simulation, not assumed.

    python -m latentstrat.bench calibrate                           # the default collection's design
    python -m latentstrat.bench calibrate --configfile config/aa.yaml --draws 2000
    python -m latentstrat.bench calibrate --fit results/sum-ablation-embedded/aggregate

Draws many collections of cell records from a declared generative model (`Scenario`) with the
design of a collection config (its cells, arms, seeds and replicates: cells.expand_cells), and
runs each through the project's own aggregate code from cells to verdict
(`aggregate.collection.verdict_tables`: setting rows, cell states, paired deltas, training noise,
interval, verdict, sign-flip test). Under the null (both arms share every setting's true value)
it prints, per scenario, with Monte Carlo standard errors:
- how often the training noise is known (every setting replicated or borrowing from replicated
  settings of its stratum); where it is not, the headline reads `cannot tell`;
- the false-sign rate: how often the headline reads a sign, `negative` or `positive` (either
  direction counts), where the arms do not differ (target: at most the look's level alpha,
  measured over enough draws that its Monte Carlo SE is at most alpha / 4: 384 draws at 0.04,
  1,584 at 0.01);
- coverage: how often the look's 1 - alpha interval holds the true delta (target >= 1 - alpha);
- mean t^2 = (delta / SE)^2: near 1 when the SE is right (for a t statistic on df degrees of
  freedom its expectation is df / (df - 2), printed beside it), and the variance ratio, the
  delta's variance across draws over the mean estimated SE^2 (1 for an unbiased variance, below 1
  for a conservative one); a biased variance shows here with far fewer draws than in the
  false-sign rate;
- the sign-flip test's rate of p below the look's level (a diagnostic, not the verdict);
- the detectable difference the report prints, k(df) x SE (k from the noncentral t), evaluated at
  the root mean square of the null draws' SEs (the median printed value, lower under few df, in
  brackets), and the power measured at that true difference (target 80% +- 5%).
The first look reads at the first level of `report.alpha_by_look`. `--procedure-draws` runs the
whole two-look procedure on null collections (`procedure`): the first look; where it cannot tell
and its report plans a follow-up with fresh seeds, the follow-up's fresh cells drawn afresh and
read at the second level; it prints how often a follow-up ran, each look's false-sign rate (each
at most its own level, the second over the runs that followed up) and the rate over both looks
(at most the levels' sum). `--second-look-seeds N ...` draws the second look alone with N fresh
seeds in every setting (what `report.followup_min_fresh_seeds` rests on).

The generative model of one cell's router information (the primary endpoint):
- per setting (family x beta): its true value when the latent starts (`values`) and the
  probability that a cell starts at all (`p_start`; 1 always, 0 never: `empty`; in between:
  bistable, a seed decides);
- seed luck: a latent normal per cell, correlated `rho_pair` between cells that train with one seed
  (the two arms of a pair; the arms of an A/A collection have seeds of their own and share none)
  and `rho_setting` across the settings of one replicate (a seed effect shared across settings);
  it decides the start (below the start quantile) and moves the value of a started cell by
  `sd_train_used` (an empty cell by `sd_train_empty`);
- test inputs: every cell's value carries test-input noise `sd_test`, a part `rho_test` of it
  shared by all cells (the same test inputs) and a part `rho_arm_test` shared by one arm's cells
  only (a draw of test inputs that suits one arm: it does not cancel in the pairs); bootstrap
  replicates are drawn the same way, shared parts shared replicate by replicate, as the cells'
  real bootstrap shares its resampled inputs;
- per example (`per_example`, bench.examples): the same noise drawn on every test example's bits,
  the cells' intervals then from the project's own bootstrap over them; router_mu_information
  (what x alone tells) at `router_mu`;
- stress: seed effects from a Student t (`noise_df`: heavy tails), the comparison arm's training
  noise a multiple of the primary's (`comparison_sd_ratio`).
Declared scenarios (`SCENARIOS`) and one fitted to a finished collection (`fit_scenario`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from latentstrat.bench.targets import _pm, checks, rate
from latentstrat.cells import Collection, beta_label
from latentstrat.families import family_label
from latentstrat.metrics import METRICS, M

METRIC = M.router_information
N_BOOT = 200  # bootstrap replicates per simulated cell (the cells' own use metrics.N_BOOT)
# what the cell-state rules may read besides router information, when the metric registry has them
MAYBE_REGISTERED = (
    M.router_mu_information,
    "router_mu_information_ci_low",
    "router_mu_information_ci_high",
    M.token_base_relative_reconstruction,
)


@dataclass(frozen=True)
class Scenario:
    """A generative model of a collection's cell records under the null (module docstring).
    `values` / `p_start`: (family, beta) -> the setting's true router information when started /
    its start probability; settings not named take `value_by_beta` / `p_by_beta`."""

    name: str
    what: str
    value_by_beta: dict = field(default_factory=lambda: {0.01: 0.55, 0.1: 0.43, 1.0: 0.0})
    p_by_beta: dict = field(default_factory=lambda: {0.01: 1.0, 0.1: 0.0, 1.0: 0.0})
    values: dict = field(default_factory=dict)
    p_start: dict = field(default_factory=dict)
    sd_test: float = 0.02
    rho_test: float = 0.5
    sd_train_used: float = 0.05
    sd_train_empty: float = 0.003
    rho_pair: float = 0.5
    rho_setting: float = 0.0
    rho_arm_test: float = 0.0  # a part of the test-input noise shared by one arm's cells (not the other's)
    rho_pair_test: float = 0.0  # a part shared by the two cells of a pair (one model family on the same inputs)
    noise_df: float = math.inf  # Student-t seed effects on this many df (heavy tails); inf: normal
    comparison_sd_ratio: float = 1.0  # the comparison arm's training noise over the primary arm's
    # per-example test outcomes (bench.examples): this many test examples per task, the cells'
    # intervals from the project's own bootstrap over them; 0: drawn at the cell level
    per_example: int = 0
    router_mu: float = 0.0  # what x alone tells (router_mu_information's true value), every cell
    # the headline's gates (bench.gates): records for them, pairs on another machine, broken cells
    gates: bool = False
    mixed_host_pairs: float = 0.0
    broken_cells: float = 0.0

    def test_weights(self) -> tuple[float, float, float, float]:
        """The test-input noise's parts as SD weights: (shared by every cell, by one arm's cells, by a
        pair's cells, the cell's own), their squares adding up to 1."""
        own = math.sqrt(max(1 - self.rho_test - self.rho_arm_test - self.rho_pair_test, 0.0))
        return math.sqrt(self.rho_test), math.sqrt(self.rho_arm_test), math.sqrt(self.rho_pair_test), own

    def value(self, family: str, beta: float) -> float:
        return float(self.values.get((family, beta), self.value_by_beta.get(beta, 0.5)))

    def start(self, family: str, beta: float) -> float:
        return float(self.p_start.get((family, beta), self.p_by_beta.get(beta, 1.0)))


# The main job's cells on a fresh clone (2-core Intel Xeon, 1200 x 32, lin300): at beta 0.01 every
# normalized family carries the strategy in both arms (router information 0.45-0.59), raw only under
# `sum`; at beta 0.1 tokcc_a0.25 in both arms (0.42-0.43), dist_tokcc only under `sum`, raw and
# dist_norm in neither; every beta 1 cell empty. Under the null both arms share each setting, so a
# setting that started in one arm only is bistable (p_start 0.5). Test-input SE of one cell's router
# information about 0.02 (6 tasks x 300 test inputs); seed-to-seed spread of a started cell about 0.05.
DEFAULT_VALUES = {("tokcc_a0.25", 0.1): 0.43, ("dist_tokcc_0.05_0.95", 0.1): 0.43, ("raw", 0.01): 0.5}
STARTS_EVERY_NORMALIZED = {("raw", 0.01): 1.0, ("tokcc_a0.25", 0.1): 1.0}
BISTABLE_AT_01 = {("raw", 0.01): 1.0, ("tokcc_a0.25", 0.1): 0.5, ("dist_tokcc_0.05_0.95", 0.1): 0.5}
# the main job's starts: raw at 0.01 and dist_tokcc at 0.1 bistable, tokcc at 0.1 started
DEFAULT_STARTS = {("raw", 0.01): 0.5, ("tokcc_a0.25", 0.1): 1.0, ("dist_tokcc_0.05_0.95", 0.1): 0.5}


def _default_pattern(name: str, what: str, **over) -> Scenario:
    """The main job's pattern (DEFAULT_VALUES, DEFAULT_STARTS) with `over` changed."""
    return Scenario(name, what, **{"values": DEFAULT_VALUES, "p_start": DEFAULT_STARTS, **over})


SCENARIOS = {
    "independent": Scenario(
        "independent",
        "no bistable cell, no seed effect across settings: the textbook case",
        values=DEFAULT_VALUES,
        p_start=STARTS_EVERY_NORMALIZED,
    ),
    "bistable": Scenario(
        "bistable",
        "two beta 0.1 settings start or not by the seed (p 0.5), values 0.43",
        values=DEFAULT_VALUES,
        p_start=BISTABLE_AT_01,
    ),
    "shared-seed": Scenario(
        "shared-seed",
        "bistable, and seed luck shared across the settings of a replicate (correlation 0.3)",
        values=DEFAULT_VALUES,
        p_start=BISTABLE_AT_01,
        rho_setting=0.3,
    ),
    "default": Scenario(
        "default",
        "the main job's pattern: raw at 0.01 and dist_tokcc at 0.1 bistable, tokcc at 0.1 started",
        values=DEFAULT_VALUES,
        p_start=DEFAULT_STARTS,
    ),
    **{
        f"beta1-starts-{p}": _default_pattern(
            f"beta1-starts-{p}",
            f"the default pattern, and every beta 1 cell starts with probability {p} (value 0.3)",
            value_by_beta={0.01: 0.55, 0.1: 0.43, 1.0: 0.3},
            p_by_beta={0.01: 1.0, 0.1: 0.0, 1.0: p},
        )
        for p in (0.2, 0.5)
    },
    "shared-test": _default_pattern(
        "shared-test",
        "the default pattern, and half the test-input noise shared by one arm's settings (same test inputs)",
        rho_test=0.0,
        rho_arm_test=0.5,
    ),
    "heavy-tails": _default_pattern(
        "heavy-tails",
        "the default pattern with seed effects drawn from a t on 3 df (a seed now and then far off)",
        noise_df=3.0,
    ),
    "unequal-arms": _default_pattern(
        "unequal-arms",
        "the default pattern, the comparison arm's training noise twice the primary arm's",
        comparison_sd_ratio=2.0,
    ),
    "per-example": _default_pattern(
        "per-example",
        "the default pattern from per-example outcomes (300 test examples per task), the intervals from the "
        "project's own bootstrap, and x alone telling 0.02 bits",
        per_example=300,
        router_mu=0.02,
    ),
    "noisy": Scenario(
        "noisy",
        "bistable with 3x the training noise and 2x the test-input noise",
        values=DEFAULT_VALUES,
        p_start={**BISTABLE_AT_01, ("raw", 0.01): 0.5},
        sd_train_used=0.15,
        sd_test=0.04,
    ),
}


# ----------------------------------------------------------------------------- design


def design(cells) -> pd.DataFrame:
    """One row per cell of a collection (`cells`, cells.expand_cells): cell id, arm, role,
    settings, the setting (pair) index and the replicate index (the rank of the cell's seed
    within its arm and setting)."""
    rows = [c.to_json() for c in cells]
    d = pd.DataFrame(rows)
    d["setting"] = d.groupby(["reconstruction_family", "beta"], sort=False).ngroup()
    d["replicate"] = d.groupby(["arm", "setting"])["seed"].rank(method="dense").astype(int) - 1
    # cells that train with one seed: the same setting and replicate seed (the two arms of a pair;
    # an A/A arm with seeds of its own shares none)
    d["pair"] = d.groupby(["setting", "seed"], sort=False).ngroup()
    d["family_label"] = [family_label(f) for f in d.reconstruction_family]
    d["beta_label"] = [beta_label(b) for b in d.beta]
    return d


# ----------------------------------------------------------------------------- one draw


def draw(d: pd.DataFrame, sc: Scenario, rng: np.random.Generator, shift: float = 0.0):
    """A simulated collection with design d: (summary of cell metrics rows, bootstrap dict).
    `shift` is added to every primary cell's true value (the alternative)."""
    if sc.gates:  # the same draw, with the records the headline's gates read
        from latentstrat.bench import gates

        summary, boot = draw(d, replace(sc, gates=False), rng, shift)
        return gates.with_records(summary, d, sc, rng), boot
    n = len(d)
    n_rep, n_pair = int(d.replicate.max()) + 1, int(d.pair.max()) + 1
    g = rng.standard_normal(n_rep)[d.replicate.to_numpy()]  # shared by the settings of a replicate
    h = rng.standard_normal(n_pair)[d.pair.to_numpy()]  # shared by the cells of one training seed
    e = rng.standard_normal(n)
    rs, rp = sc.rho_setting, max(sc.rho_pair, sc.rho_setting)
    luck = math.sqrt(rs) * g + math.sqrt(rp - rs) * h + math.sqrt(1 - rp) * e
    fam, beta = d.reconstruction_family.to_numpy(), d.beta.to_numpy(dtype=float)
    p = np.array([sc.start(f, b) for f, b in zip(fam, beta)])
    value = np.array([sc.value(f, b) for f, b in zip(fam, beta)])
    started = luck < stats.norm.ppf(np.clip(p, 1e-12, 1 - 1e-12))
    started[p >= 1] = True
    started[p <= 0] = False
    # the value's own training noise: independent of the start draw given the structure
    noise = math.sqrt(rs) * _seed_effects(rng, n_rep, sc.noise_df)[d.replicate.to_numpy()]
    noise += math.sqrt(rp - rs) * _seed_effects(rng, n_pair, sc.noise_df)[d.pair.to_numpy()]
    noise += math.sqrt(1 - rp) * _seed_effects(rng, n, sc.noise_df)
    primary = d.role.to_numpy() == "primary"
    noise = noise * np.where(primary, 1.0, sc.comparison_sd_ratio)
    truth = np.where(started, value + sc.sd_train_used * noise, sc.sd_train_empty * noise)
    truth = truth + shift * primary
    arm, pair = pd.factorize(d.arm)[0], d.pair.to_numpy()
    if sc.per_example:
        return _per_example(d, sc, rng, truth, started, (arm, pair))
    shared, by_arm, by_pair, own = sc.test_weights()
    observed = truth + sc.sd_test * (
        shared * rng.standard_normal()
        + by_arm * rng.standard_normal(arm.max() + 1)[arm]
        + by_pair * rng.standard_normal(n_pair)[pair]
        + own * rng.standard_normal(n)
    )
    tau, tau_arm, tau_pair = (
        rng.standard_normal(N_BOOT),
        rng.standard_normal((arm.max() + 1, N_BOOT)),
        rng.standard_normal((n_pair, N_BOOT)),
    )
    reps = observed[:, None] + sc.sd_test * (
        shared * tau[None, :]
        + by_arm * tau_arm[arm]
        + by_pair * tau_pair[pair]
        + own * rng.standard_normal((n, N_BOOT))
    )
    mu = tuple(np.full(len(d), sc.router_mu + off) for off in (0.0, -0.005, 0.005))
    return _collection(d, started, observed, reps, mu)


def _per_example(d: pd.DataFrame, sc: Scenario, rng, truth: np.ndarray, started: np.ndarray, groups: tuple):
    """The collection of `draw` from per-example outcomes (bench.examples): router information and
    router_mu_information each from its examples' bits, their intervals from the project's bootstrap."""
    from latentstrat.bench import examples

    arm, pair = groups
    bits = examples.example_bits(sc, rng, truth, arm, pair, sc.per_example)
    observed, reps = examples.replicates(bits, M.router_information, N_BOOT)
    mu_bits = examples.example_bits(sc, rng, np.full(len(d), sc.router_mu), arm, pair, sc.per_example)
    mu_value, mu_reps = examples.replicates(mu_bits, M.router_mu_information, N_BOOT)
    mu_lo, mu_hi = np.percentile(mu_reps, [2.5, 97.5], axis=1)
    return _collection(d, started, observed, reps, (mu_value, mu_lo, mu_hi))


def _collection(d: pd.DataFrame, started: np.ndarray, observed: np.ndarray, reps: np.ndarray, mu: tuple):
    """(summary rows, bootstrap dict) of a drawn collection: router information with its replicates'
    interval, router_mu_information (value, low, high), and the loss metrics the cell states read."""
    lo, hi = np.percentile(reps, [2.5, 97.5], axis=1)
    info, mu_name = M.router_information, M.router_mu_information
    summary = d.drop(columns=["setting", "replicate", "pair"]).assign(
        **{
            info: observed,
            f"{info}_ci_low": lo,
            f"{info}_ci_high": hi,
            mu_name: mu[0],
            f"{mu_name}_ci_low": mu[1],
            f"{mu_name}_ci_high": mu[2],
            M.kl_prior_loss: np.where(started, 2.0, 0.001),
            M.base_relative_reconstruction: np.where(started, 0.4, 1.0),
            M.token_base_relative_reconstruction: np.where(started, 0.4, 1.0),
        }
    )
    registered = {c for m in METRICS for c in (m, f"{m}_ci_low", f"{m}_ci_high")}
    summary = summary.drop(columns=[c for c in MAYBE_REGISTERED if c not in registered])
    boot = {cid: pd.DataFrame({METRIC: reps[i]}) for i, cid in enumerate(d.cell_id)}
    return summary, boot


def _seed_effects(rng, size: int, df: float) -> np.ndarray:
    """Unit-variance seed effects: normal, or Student t on df (> 2) degrees of freedom scaled to
    variance 1 (heavy tails: a seed now and then far off)."""
    if not math.isfinite(df):
        return rng.standard_normal(size)
    return rng.standard_t(df, size) / math.sqrt(df / (df - 2))


def analyse(summary: pd.DataFrame, boot: dict, arm: str, thr: dict, collection: Collection | None = None) -> dict:
    """The project's verdict on one simulated collection (aggregate.collection.verdict_tables), at
    the level `thr` sets (its `look_alpha`, else the first look's); with `collection`
    (cells.Collection), also the follow-up its report would plan
    (aggregate.followup.followup_plan) under `plan`."""
    from latentstrat.aggregate.collection import CollectionData, verdict_tables
    from latentstrat.aggregate.followup import followup_plan

    data = CollectionData(summary, None, {}, ["reconstruction_family", "beta"], None, boot)
    t, _ = verdict_tables(data, thr, descriptive=False)
    a = t["arm_contrasts"]
    r = a[(a.comparison_arm == arm) & (a.metric == METRIC)].iloc[0]
    out = {k: r[k] for k in ("verdict", "mean_delta", "ci_low", "ci_high", "se", "interval_df", "detectable_delta")} | {
        "known": bool(r.training_noise_in_interval),
        "sign_flip_p": float(r.sign_flip_p),
    }
    if "train_cpu" in summary.columns:  # drawn with the gates' records (bench.gates)
        from latentstrat.bench.gates import headline_verdict

        out["headline"] = headline_verdict(t, summary, thr)
    if collection is not None:
        contrasts = a[a.comparison_arm == arm]
        out["plan"] = followup_plan(collection, contrasts, pd.DataFrame(columns=["total_s"]), commons=t["common_cells"])
    return out


def run_scenario(d: pd.DataFrame, sc: Scenario, arm: str, thr: dict, draws: int, power_draws: int, seed: int) -> dict:
    """The null draws and the power draws of one scenario: the row `table` prints."""
    from latentstrat.aggregate.power import look_alpha

    alpha = thr.get("look_alpha") or look_alpha(thr, False)
    rng = np.random.default_rng(seed)
    null = pd.DataFrame([analyse(*draw(d, sc, rng), arm, thr) for _ in range(draws)])
    known = null[null.known]
    t2 = (known.mean_delta / known.se) ** 2
    dfs = known.interval_df[np.isfinite(known.interval_df) & (known.interval_df > 2)]
    # the detectable difference the report prints is k(df) * SE-hat with SE-hat^2 an (about) unbiased
    # estimate of the delta's variance; the power is measured at k(df) * the root mean square of the
    # draws' SE-hat (their median printed value, lower under few df, is shown beside it)
    factor = (null.detectable_delta / null.se).median()
    detect = float(factor * math.sqrt((null.se**2).mean()))
    row = {
        "scenario": sc.name,
        "draws": draws,
        "noise_known": float(null.known.mean()),
        "false_sign": rate(null.verdict != "cannot tell"),
        "coverage": rate((known.ci_low <= 0) & (0 <= known.ci_high)),
        "mean_t2": (float(t2.mean()), float(t2.std(ddof=1) / math.sqrt(len(t2))) if len(t2) > 1 else math.nan),
        # the delta's variance across draws over the mean estimated variance: 1 when the SE is unbiased
        "variance_ratio": float((known.mean_delta**2).mean() / (known.se**2).mean()) if len(known) else math.nan,
        "t2_expected": float((dfs / (dfs - 2)).median()) if len(dfs) else 1.0,
        "alpha": alpha,
        "sign_flip": rate(null.sign_flip_p < alpha),
        "median_df": float(known.interval_df.median()) if len(known) else math.nan,
        "median_width": float((known.ci_high - known.ci_low).median()) if len(known) else math.nan,
        "detectable": detect,
        "detectable_median": float(null.detectable_delta.median()),
    }
    if power_draws and math.isfinite(detect):
        alt = pd.DataFrame([analyse(*draw(d, sc, rng, shift=detect), arm, thr) for _ in range(power_draws)])
        row["power"] = rate(alt.verdict == "positive")
        ok = alt[alt.known]
        row["coverage_alt"] = rate((ok.ci_low <= detect) & (detect <= ok.ci_high))
    return row


def table(rows: list[dict]) -> str:
    """The scenarios' Markdown table (± one Monte Carlo SE)."""
    head = (
        "| scenario | draws | training noise known | false-sign rate | coverage | mean t² (t_df: df/(df-2)) | "
        "variance ratio | sign-flip p < level | median df | median interval width | detectable (median printed) | "
        "power at it | meets targets |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        miss = checks(r)
        lines.append(
            f"| {r['scenario']} | {r['draws']} | {r['noise_known']:.2f} | {_pm(r['false_sign'])} | "
            f"{_pm(r['coverage'])} | "
            f"{r['mean_t2'][0]:.2f} ± {r['mean_t2'][1]:.2f} ({r['t2_expected']:.2f}) | {r['variance_ratio']:.2f} | "
            f"{_pm(r['sign_flip'])} | "
            f"{r['median_df']:.1f} | {r['median_width']:.3f} | {r['detectable']:.3f} ({r['detectable_median']:.3f}) | "
            f"{_pm(r['power']) if 'power' in r else 'NA'} | "
            f"{'yes' if not miss else 'no: ' + '; '.join(miss)} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- fitted to a collection


def _pooled_sd(s: pd.DataFrame, mask) -> float:
    """The pooled within-arm seed-to-seed SD of router information over the settings in `mask`."""
    num = den = 0.0
    for _, g in s[mask].groupby(["arm", "reconstruction_family", "beta"]):
        if len(g) >= 2:
            num += float(g[METRIC].var(ddof=1)) * (len(g) - 1)
            den += len(g) - 1
    return math.sqrt(num / den) if den else math.nan


def _pair_correlation(s: pd.DataFrame) -> float:
    """The correlation of the two cells of a pair (one training seed) over settings whose cells all
    started: var(primary - comparison) = var_p + var_c - 2 cov, pooled over settings with two or
    more seeds in both arms; NaN without any."""
    num = den = 0.0
    for _, g in s.groupby(["reconstruction_family", "beta"]):
        if not g.used.all():
            continue
        arms = [a for _, a in g.groupby("role")]
        if len(arms) != 2:
            continue
        p, c = (a.set_index("seed")[METRIC] for a in arms)
        common = p.index.intersection(c.index)
        if len(common) < 2:
            continue
        num += float((p[common] - c[common]).var(ddof=1))
        den += float(p[common].var(ddof=1) + c[common].var(ddof=1))
    return float(np.clip(1 - num / den, 0.0, 0.95)) if den > 0 else math.nan


def _test_correlations(s: pd.DataFrame, cells_dir: Path) -> dict:
    """The test inputs' correlation between cells from their bootstrap replicates (every cell
    resamples the same test inputs): across arms and settings (`rho_test`), extra within one arm
    (`rho_arm_test`), extra within a pair (`rho_pair_test`); {} without bootstrap files."""
    reps = {}
    for cid in s.cell_id:
        f = cells_dir / cid / "bootstrap.parquet"
        if f.is_file():
            reps[cid] = pd.read_parquet(f)[METRIC].to_numpy(dtype=float)
    if len(reps) < 3 or len({len(v) for v in reps.values()}) != 1:
        return {}
    ids = list(reps)
    r = np.corrcoef(np.stack([reps[i] for i in ids]))
    info = s.set_index("cell_id").loc[ids]
    arm, setting = info.arm.to_numpy(), list(zip(info.reconstruction_family, info.beta, info.seed))
    same_arm, pair, other = [], [], []
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            if arm[i] == arm[j]:
                same_arm.append(r[i, j])
            elif setting[i] == setting[j]:
                pair.append(r[i, j])
            else:
                other.append(r[i, j])
    base = float(np.clip(np.mean(other), 0, 0.95)) if other else 0.0
    arm_part = float(np.clip(np.mean(same_arm) - base, 0, 0.95 - base)) if same_arm else 0.0
    pair_part = float(np.clip(np.mean(pair) - base, 0, 0.95 - base - arm_part)) if pair else 0.0
    return {"rho_test": base, "rho_arm_test": arm_part, "rho_pair_test": pair_part}


def fit_scenario(aggregate_dir) -> Scenario:
    """A null scenario fitted to a finished collection's aggregate tables (summary.parquet and
    cell_states.parquet) and its cells' bootstrap files (`<collection>/cells/<cell>/`): per
    setting, the share of its cells (both arms, every seed) that use z (p_start) and their mean
    router information (the value); the test-input SE as the cells' median bootstrap half-width /
    1.96, and its correlation between cells (across arms, within an arm, within a pair) from the
    bootstrap replicates; the training noise of a started cell as the pooled within-arm
    seed-to-seed SD of settings whose cells all started, of an empty cell likewise; the pair
    correlation from the paired deltas' spread of started settings."""
    from latentstrat.io import read_parquet

    agg = Path(aggregate_dir)
    s = read_parquet(agg / "summary.parquet", "aggregate summary")
    st = read_parquet(agg / "cell_states.parquet", "aggregate cell states")[["cell_id", "state"]]
    s = s.merge(st, on="cell_id", how="left")
    s["beta"] = s.beta.astype(float)
    s["used"] = s.state.ne("empty")
    if "role" not in s.columns:
        s["role"] = np.where(s.arm == s.arm.iloc[0], "primary", "comparison")
    values, p_start = {}, {}
    for (fam, beta), g in s.groupby(["reconstruction_family", "beta"]):
        p_start[(fam, beta)] = float(g.used.mean())
        values[(fam, beta)] = float(g.loc[g.used, METRIC].mean()) if g.used.any() else 0.0
    sd_test = float(((s[f"{METRIC}_ci_high"] - s[f"{METRIC}_ci_low"]) / (2 * 1.959964)).median())
    by = ["arm", "reconstruction_family", "beta"]
    sd_used = _pooled_sd(s, s.groupby(by).used.transform("all"))
    sd_empty = _pooled_sd(s, ~s.groupby(by).used.transform("any"))
    rho_pair = _pair_correlation(s)
    name = str(s["collection"].iloc[0]) if "collection" in s.columns else agg.parent.name
    return Scenario(
        f"fitted: {name}",
        f"fitted to {agg}",
        values=values,
        p_start=p_start,
        sd_test=sd_test,
        sd_train_used=sd_used if math.isfinite(sd_used) else 0.05,
        sd_train_empty=sd_empty if math.isfinite(sd_empty) else 0.003,
        rho_pair=rho_pair if math.isfinite(rho_pair) else 0.5,
        **_test_correlations(s, agg.parent / "cells"),
    )


def describe(sc: Scenario) -> str:
    """A fitted scenario's parameters in one line (what the table's row was drawn from)."""
    return (
        f"sd_test {sc.sd_test:.4f} (shared {sc.rho_test:.2f}, within an arm {sc.rho_arm_test:.2f}, within a pair "
        f"{sc.rho_pair_test:.2f}); training noise of a started cell {sc.sd_train_used:.4f}, of an empty one "
        f"{sc.sd_train_empty:.4f}; pair correlation {sc.rho_pair:.2f}; start probabilities "
        + ", ".join(f"{family_label(f)} {b:g}: {p:.2f}" for (f, b), p in sorted(sc.p_start.items()))
    )
