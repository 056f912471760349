"""Metric registry: the one place for metric names, labels, derived-metric formulas and the
bootstrap that gives a metric its 95% interval.

Every metric is declared here once (`Metric`: name, label, direction, level, what uses it, the
objective term it logs, whether the training history has it). Other modules name a metric as
`M.<name>` (a plain str), never as a string literal: `tests/test_metric_names.py` fails on one.
`python -m latentstrat.metrics > docs/metrics.md` writes the reference users read. The cell-metrics
stage that computes a cell's row is latentstrat.cell.tabulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the version of what the probe and tabulate jobs write (probe tables, a cell's metrics row): their
# rules take it as a param, so a change that makes cached tables unreadable reruns those jobs once
# (never training); bump it with such a change
CELL_TABLES_VERSION = 3
ACTIVE_UNIT_VARIANCE = 0.01  # a latent dimension is active when Var_x(mu_q - mu_r) exceeds this


class M:
    """Metric names, each a plain str equal to its attribute name (metrics rows' columns, history
    and record columns); METRICS[M.<name>] is its declaration."""

    router_information = "router_information"
    router_mu_information = "router_mu_information"
    single_strategy_share = "single_strategy_share"
    followed_strategy_entropy = "followed_strategy_entropy"
    router_information_of_followed = "router_information_of_followed"
    matched_router_score = "matched_router_score"
    within_task_router_probe = "within_task_router_probe"
    global_router_probe = "global_router_probe"
    strategy_match_rate = "strategy_match_rate"
    posterior_probe = "posterior_probe"
    final_answer_accuracy = "final_answer_accuracy"
    reconstruction_loss = "reconstruction_loss"
    base_relative_reconstruction = "base_relative_reconstruction"
    token_base_relative_reconstruction = "token_base_relative_reconstruction"
    tokcc_reconstruction_loss = "tokcc_reconstruction_loss"
    kl_prior_loss = "kl_prior_loss"
    active_reconstruction_objective = "active_reconstruction_objective"
    kl_over_active_reconstruction = "kl_over_active_reconstruction"
    inferred_zfree_reference_scale = "inferred_zfree_reference_scale"
    posterior_router_probe_gap = "posterior_router_probe_gap"
    active_units = "active_units"


# what a metric is used for beyond its tables and figures (docs/design.md): `endpoint` (the
# primary endpoint by default), `fallback endpoint` (external tables without it), `state` (decides
# cell states), `sanity` (the cell sanity check)
USES = ("endpoint", "fallback endpoint", "state", "sanity")
LEVELS = ("task", "cell")  # task: per task, then the mean over tasks; cell: one value over the test inputs


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    higher_is_better: bool | None  # None: neither (scales, diagnostics)
    description: str
    level: str  # LEVELS
    uses: tuple[str, ...] = ()  # USES
    loss_term: str | None = None  # the objective.forward_losses key it is (evaluate records, validation)
    in_history: bool = False  # the trainer's validation logs it (training history)
    unit: str = ""  # what a value counts, where a label alone does not say

    def __post_init__(self):
        assert self.level in LEVELS and set(self.uses) <= set(USES), self


_M = [
    Metric(
        M.router_information,
        "router information",
        True,
        "the primary endpoint (docs/design.md): per task, the cross-validated information I_cv(z; s) in bits between "
        "router-sampled z and the strategy the generation followed, per test example, over the entropy of the data's "
        "strategy mix; mean over tasks. 0 = z says nothing (or one strategy is followed), 1 = z fixes the strategy",
        level="task",
        uses=("endpoint", "state"),
        unit="share of the strategy entropy",
    ),
    Metric(
        M.router_mu_information,
        "router-mean information",
        None,
        "router_information's probe on the router's mean mu_r(x) instead of the sampled z: what x alone tells "
        "about the followed strategy (per task, bits per test example over the entropy of the data's strategy "
        "mix; mean over tasks). router_information above it is what the sampled z adds beyond x",
        level="task",
        uses=("state",),
        unit="share of the strategy entropy",
    ),
    Metric(
        M.single_strategy_share,
        "single-strategy share",
        None,
        "router_information's first part: per task, the share of generations that follow exactly one strategy; "
        "mean over tasks",
        level="task",
    ),
    Metric(
        M.followed_strategy_entropy,
        "followed-strategy entropy",
        None,
        "router_information's second part: per task, the entropy (bits) of the strategies the single-strategy "
        "generations follow; mean over tasks",
        level="task",
    ),
    Metric(
        M.router_information_of_followed,
        "router information of the followed mix",
        True,
        "router_information's third part: per task, the bits per single-strategy generation over the followed "
        "mix's entropy (NaN where it is 0); mean over the tasks where defined. Per task router_information = "
        "share x this x followed entropy / data entropy",
        level="task",
    ),
    Metric(
        M.matched_router_score,
        "matched router score",
        True,
        "within_task_router_probe x strategy_match_rate",
        level="task",
        uses=("fallback endpoint",),
    ),
    Metric(
        M.within_task_router_probe,
        "within-task router probe",
        True,
        "per task, CV accuracy of a linear probe from router-sampled z to the strategy the generation followed "
        "(unambiguous matches); mean over tasks",
        level="task",
    ),
    Metric(
        M.global_router_probe,
        "global router probe",
        True,
        "one probe over all tasks from router-sampled z to task:strategy",
        level="cell",
    ),
    Metric(
        M.strategy_match_rate,
        "strategy-match rate",
        True,
        "fraction of generations whose trace matches at least one strategy",
        level="cell",
        uses=("sanity",),
        in_history=True,
    ),
    Metric(
        M.posterior_probe,
        "posterior probe",
        True,
        "per task, CV accuracy from the posterior mean mu_q(x, y_true) to the true strategy; mean over tasks",
        level="task",
        in_history=True,
    ),
    Metric(
        M.final_answer_accuracy,
        "final answer accuracy",
        True,
        "mean verifier result over router-sampled greedy generations",
        level="cell",
        uses=("sanity",),
        in_history=True,
    ),
    Metric(
        M.reconstruction_loss,
        "reconstruction loss",
        False,
        "raw reconstruction: mean_i A_i(l)",
        level="cell",
        loss_term="raw",
        in_history=True,
    ),
    Metric(
        M.base_relative_reconstruction,
        "base-relative reconstruction",
        False,
        "raw reconstruction over the entangled model's (raw / S_ref): 1 = the entangled model, below 1 = z carries "
        "information",
        level="cell",
        uses=("sanity",),
        loss_term="dist_norm",
        in_history=True,
    ),
    Metric(
        M.token_base_relative_reconstruction,
        "token-weighted base-relative reconstruction",
        False,
        "the cell's test NLL summed over examples and supervised tokens over the entangled model's (sum of b) on "
        "the same tokens: one weighting whatever the token aggregation (base_relative_reconstruction is "
        "token-weighted under sum, example-weighted under mean). 1 = the entangled model",
        level="cell",
        uses=("state",),
    ),
    Metric(
        M.tokcc_reconstruction_loss,
        "tokcc reconstruction",
        False,
        "token-weighted concentration-corrected reconstruction: mean_i A_i(w*l) / T_ref",
        level="cell",
        loss_term="tokcc",
        in_history=True,
    ),
    Metric(
        M.kl_prior_loss,
        "KL to prior",
        False,
        "KL(q(z|x,y) || p_router(z|x)), summed over latent dims, mean over examples",
        level="cell",
        uses=("state",),
        loss_term="kl",
        in_history=True,
    ),
    Metric(
        M.active_reconstruction_objective,
        "active reconstruction objective",
        False,
        "the reconstruction family this cell optimizes",
        level="cell",
        loss_term="active",
        in_history=True,
    ),
    Metric(
        M.kl_over_active_reconstruction,
        "KL / active recon",
        None,
        "kl_prior_loss / active_reconstruction_objective",
        level="cell",
        in_history=True,
    ),
    Metric(
        M.inferred_zfree_reference_scale,
        "inferred z-free reference scale",
        None,
        "reconstruction_loss / base_relative_reconstruction = S_ref",
        level="cell",
        in_history=True,
    ),
    Metric(
        M.posterior_router_probe_gap,
        "posterior-router probe gap",
        None,
        "mean over the tasks both probes cover of posterior_probe - within_task_router_probe",
        level="task",
    ),
    Metric(
        M.active_units,
        "active units",
        None,
        "latent dimensions whose posterior mean minus the router's mean varies across test inputs by more than "
        f"{ACTIVE_UNIT_VARIANCE} (variance): the dimensions z uses beyond what x decides",
        level="cell",
    ),
]
METRICS: dict[str, Metric] = {m.name: m for m in _M}
# the metrics the arms are compared on (common cells' deltas, arm contrasts): the primary
# endpoint (report.primary_metric) is one of them
CONTRAST_METRICS = (
    M.router_information,
    M.matched_router_score,
    M.final_answer_accuracy,
    M.active_reconstruction_objective,
)
# the primary endpoint unless `report.primary_metric` declares another (one of CONTRAST_METRICS),
# and the metric a ranking falls back to where rows (an external table) lack the endpoint
ENDPOINT = M.router_information
ENDPOINT_FALLBACK = M.matched_router_score
# metrics a metrics row written before them (or an external table) lacks: NaN there (`derive`)
LATER_METRICS = (
    M.router_mu_information,
    M.single_strategy_share,
    M.followed_strategy_entropy,
    M.router_information_of_followed,
    M.token_base_relative_reconstruction,
)
# the order of the original study's "Metric Distributions" table
DISTRIBUTION_METRICS = list(METRICS)
# a training history (long format): the cell trainer's rows; the entangle stage's have no cell_id
HISTORY_COLUMNS = ["cell_id", "step", "task", "metric", "value"]
ENTANGLE_HISTORY_COLUMNS = HISTORY_COLUMNS[1:]
# objective.forward_losses key -> the metric (history, record and metrics-row column) it is: the
# reconstruction terms every cell logs (latentstrat.families.TERMS), the KL, the family's own objective
LOSS_METRIC_OF = {m.loss_term: m.name for m in _M if m.loss_term}
LOSS_METRICS = list(LOSS_METRIC_OF.values())
PROBE_METRICS = [M.within_task_router_probe, M.global_router_probe, M.posterior_probe]
# what stands next to every probe number: chance (majority-class rate), shuffled-label control,
# chance-corrected accuracy (accuracy - chance) / (1 - chance), tasks covered
PROBE_CONTROLS = ("chance", "shuffled", "corrected", "tasks")

# diagnostics logged during training (weights default 0)
DIAGNOSTICS = {
    "posterior_variance": "posterior variance (mean exp(logvar_q))",
    "router_marginal_kl_to_prior": "router marginal KL to N(0, I)",
}
# per-task training-history metrics (task != "all")
PER_TASK_HISTORY = {
    "token_count_mean": "mean supervised tokens per example",
    "example_share": "share of examples",
    "token_share": "share of supervised tokens",
    "loss_share": "share of the summed (aggregated) reconstruction loss",
    "grad_norm_share": "share of gradient norm",
}


# The trainer's validation scores the strategy a generation follows by likelihood (validation.
# scored_strategies), on a small subset, where the metrics row decodes it: its router probes and
# matched router score are other quantities and carry their own names in the history (metrics-row
# name -> history name). Histories written before the names parted are read with these names
# (`history_name`).
SCORED_NAMES = {
    M.within_task_router_probe: "scored_router_probe",
    "within_task_router_probe_chance": "scored_router_probe_chance",
    M.global_router_probe: "scored_global_router_probe",
    "global_router_probe_chance": "scored_global_router_probe_chance",
    M.matched_router_score: "scored_matched_router_score",
}


def history_name(name: str) -> str:
    """A history metric's name now (an older history's router probes get their scored names)."""
    return SCORED_NAMES.get(name, name)


# how the trainer's validation history names its proxies when shown (dynamics tables, figures)
VALIDATION_LABELS = {
    "scored_router_probe": "validation router probe (likelihood-scored)",
    "scored_global_router_probe": "validation global router probe (likelihood-scored)",
    "scored_matched_router_score": "validation matched router score (likelihood-scored)",
    M.posterior_probe: "validation posterior probe",
    M.final_answer_accuracy: "validation answer accuracy (decoded subset)",
    M.strategy_match_rate: "validation strategy-match rate (decoded subset)",
}


def history_label(name: str) -> str:
    """The label of a training-history metric: validation proxies by their own names."""
    return VALIDATION_LABELS.get(name, label(name))


def probe_label(name: str) -> str:
    """Labels for a metric or a probe control (`within_task_router_probe_chance` ->
    "within-task router probe: chance")."""
    for m in PROBE_METRICS:
        for c in PROBE_CONTROLS:
            if name == f"{m}_{c}":
                return f"{METRICS[m].label}: {'chance-corrected' if c == 'corrected' else c}"
    return label(name)


def unit(name: str) -> str:
    """A metric's unit (empty where its label says it)."""
    return METRICS[name].unit if name in METRICS else ""


def label(name: str) -> str:
    if name in METRICS:
        return METRICS[name].label
    if name in DIAGNOSTICS:
        return DIAGNOSTICS[name]
    if name in PER_TASK_HISTORY:
        return PER_TASK_HISTORY[name]
    return name.replace("_", " ")


def _nan_if_missing(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return x


def safe_ratio(a, b) -> float:
    a, b = _nan_if_missing(a), _nan_if_missing(b)
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def derive(row: dict) -> dict:
    """Add the derived metrics to a row that has the base metrics. Returns a new dict.

    The identities the tests check on every row live here and nowhere else.
    """
    out = dict(row)
    for name in LATER_METRICS:
        out.setdefault(name, math.nan)
    out[M.matched_router_score] = _nan_if_missing(row.get(M.within_task_router_probe)) * _nan_if_missing(
        row.get(M.strategy_match_rate)
    )
    if math.isnan(_nan_if_missing(row.get(M.posterior_router_probe_gap))):  # else: computed over shared tasks
        out[M.posterior_router_probe_gap] = _nan_if_missing(row.get(M.posterior_probe)) - _nan_if_missing(
            row.get(M.within_task_router_probe)
        )
    out[M.kl_over_active_reconstruction] = safe_ratio(
        row.get(M.kl_prior_loss), row.get(M.active_reconstruction_objective)
    )
    out[M.inferred_zfree_reference_scale] = safe_ratio(
        row.get(M.reconstruction_loss), row.get(M.base_relative_reconstruction)
    )
    return out


# ----------------------------------------------------------------------------- intervals

BOOTSTRAP_FILE = "bootstrap.parquet"  # beside a cell's row.parquet
N_BOOT = 1000  # bootstrap replicates per cell
BOOT_SEED = 20261201
# per-cell test metrics that get a 95% bootstrap interval (<metric>_ci_low / _ci_high)
BOOTSTRAP_METRICS = [
    M.router_information,
    M.router_mu_information,
    M.token_base_relative_reconstruction,
    M.final_answer_accuracy,
    M.strategy_match_rate,
    *LOSS_METRICS,
    M.within_task_router_probe,
    "within_task_router_probe_corrected",
    M.posterior_probe,
    "posterior_probe_corrected",
    M.matched_router_score,
    M.posterior_router_probe_gap,
]


def resample_counts(task_sizes: dict, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Per task, a [n_boot, n_t] matrix: how often each of the task's test examples (in record
    order) is drawn in each replicate, resampling within task. The draws depend only on (seed,
    task, n_t), so every cell evaluated on the same test examples gets the same replicates, and
    a difference of two cells' replicates is a paired bootstrap of their difference."""
    import zlib

    import numpy as np

    out = {}
    for task, n in task_sizes.items():
        rng = np.random.default_rng([seed, zlib.crc32(task.encode()), n])
        idx = rng.integers(0, n, size=(n_boot, n))
        counts = np.zeros((n_boot, n))
        np.add.at(counts, (np.arange(n_boot)[:, None], idx), 1)
        out[task] = counts
    return out


def interval(replicates, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN replicates left out; NaN if none)."""
    import numpy as np

    v = np.asarray(replicates, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(v, [a, 100 - a])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- the reference


def reference_markdown() -> str:
    """docs/metrics.md: every declared metric with its label, direction, level and uses."""
    arrow = {True: "higher", False: "lower", None: ""}
    out = [
        "# Metrics",
        "",
        "Every metric a cell's row, a table or a figure shows, generated from its declaration",
        "(`src/latentstrat/metrics.py`) by `python -m latentstrat.metrics > docs/metrics.md`; a test keeps the",
        "two in sync. *Better*: the direction a better model moves it (blank: neither). *Level*: `task`",
        "is computed per task, then averaged over tasks; `cell` is one value over the cell's test inputs.",
        "*Uses*: `endpoint` the primary endpoint (docs/design.md, Primary endpoint), `fallback endpoint`",
        "the one external tables without it are ranked by, `state` an input of the cell states, `sanity`",
        "an input of the cell sanity check. *History*: the trainer's validation logs it too.",
        "",
        "| metric | label | better | level | uses | history | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in METRICS.values():
        cells = [f"`{m.name}`", m.label, arrow[m.higher_is_better], m.level, ", ".join(m.uses)]
        cells += ["yes" if m.in_history else "", m.description.replace("|", "\\|")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
