"""Report figures (seaborn, Agg backend). Each maker returns a Figure, or None when its data is absent."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from latentstrat.aggregate.columns import SHARE_METRICS  # noqa: E402
from latentstrat.io import atomic_path  # noqa: E402
from latentstrat.metrics import M, history_label, label  # noqa: E402
from latentstrat.report.forest import primary_contrast_forest  # noqa: E402
from latentstrat.report.frames import (  # noqa: E402
    BETA,
    ENDPOINT_NOTE,
    FAM,
    FRAMES,
    drawn_arms,
    endpoint,
    heatmap_frame,
    history_rows,
    primary_rows,
    setting_rows,
)

sns.set_theme(style="whitegrid", context="paper")


def _need(df: pd.DataFrame, *cols) -> bool:
    return not df.empty and all(c in df.columns and df[c].notna().any() for c in cols)


def _err(df, col):
    """Error bars of a column: its 95% interval (`<col>_ci_low/_ci_high`, asymmetric) when
    recorded, else the std across seeds; None when neither."""
    lo, hi = f"{col}_ci_low", f"{col}_ci_high"
    if lo in df.columns and df[lo].notna().any():
        return np.vstack([(df[col] - df[lo]).clip(lower=0).fillna(0), (df[hi] - df[col]).clip(lower=0).fillna(0)])
    std = f"{col}_std"
    if std in df.columns and df[std].notna().any():
        return df[std].fillna(0).to_numpy()
    return None


def _errorbars(ax, df, x, y):
    for axis, col in (("x", x), ("y", y)):
        err = _err(df, col)
        if err is not None:
            kw = {"xerr": err} if axis == "x" else {"yerr": err}
            ax.errorbar(df[x], df[y], fmt="none", ecolor="0.4", elinewidth=0.8, capsize=2, **kw)


def _scatter(df, x, y, title):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.scatterplot(data=df, x=x, y=y, hue=FAM, style=BETA, s=70, ax=ax)
    _errorbars(ax, df, x, y)
    ax.set(xlabel=label(x), ylabel=label(y), title=title)
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def objective_scale_heatmap(t):
    got = heatmap_frame(t)
    if got is None:
        return None
    delta, z = got
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * delta.shape[1] + 3), 1.1 * len(delta) + 2.2))
    # NA deltas (e.g. a probe with too few matched generations) are drawn grey and labelled NA
    ax.set_facecolor("0.85")
    annot = delta.map(lambda v: "NA" if pd.isna(v) else f"{v:+.4f}")
    sns.heatmap(
        z.clip(-3, 3),
        annot=annot,
        fmt="",
        cmap="RdBu_r",
        center=0,
        vmin=-3,
        vmax=3,
        cbar_kws={"label": "delta / its interval's half-width (beyond 1: clear of 0)"},
        ax=ax,
        annot_kws={"fontsize": 8},
    )
    for (i, j), v in np.ndenumerate(delta.to_numpy(dtype=float)):
        if np.isnan(v):  # seaborn skips annotations on NaN cells
            ax.text(j + 0.5, i + 0.5, "NA", ha="center", va="center", fontsize=8, color="0.3")
    title = "Primary minus comparison arm\n(annotations: deltas; colors: delta over its noise)"
    ax.set(xlabel="", ylabel="", title=title)
    plt.setp(ax.get_xticklabels(), rotation=35, ha="right")
    fig.tight_layout()
    return fig


def kl_vs_reconstruction(t):
    df = setting_rows(t)
    if not _need(df, M.kl_prior_loss, M.active_reconstruction_objective):
        return None
    df = df.assign(**{FAM: df["arm"] + ": " + df[FAM]}) if "arm" in df.columns and df.arm.nunique() > 1 else df
    return _scatter(df, M.active_reconstruction_objective, M.kl_prior_loss, "KL-to-reconstruction trade-off")


def _bar(df, y, title):
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.barplot(data=df, x=FAM, y=y, hue=BETA, ax=ax, errorbar=None)
    if _err(df, y) is not None:
        for cont, (_, g) in zip(ax.containers, df.groupby(BETA, sort=False)):
            xs = [b.get_x() + b.get_width() / 2 for b in cont]
            err = _err(g, y)
            err = err[..., : len(xs)] if err is not None else None
            ax.errorbar(xs, [b.get_height() for b in cont], yerr=err, fmt="none", ecolor="0.2", capsize=2)
    ax.set(xlabel="reconstruction family", ylabel=label(y), title=title)
    ax.legend(title="", fontsize=8)
    fig.tight_layout()
    return fig


def kl_recon_ratio(t):
    df = primary_rows(t)
    return (
        _bar(df, M.kl_over_active_reconstruction, "KL / active reconstruction (primary arm)")
        if _need(df, M.kl_over_active_reconstruction)
        else None
    )


def posterior_router_gap(t):
    df = primary_rows(t)
    return (
        _bar(df, M.posterior_router_probe_gap, "Posterior minus router probe (primary arm)")
        if _need(df, M.posterior_router_probe_gap)
        else None
    )


def base_relative_vs_router(t):
    df = setting_rows(t)
    if not _need(df, M.base_relative_reconstruction, M.within_task_router_probe):
        return None
    df = df.assign(**{FAM: df["arm"] + ": " + df[FAM]}) if "arm" in df.columns and df.arm.nunique() > 1 else df
    fig = _scatter(
        df,
        M.base_relative_reconstruction,
        M.within_task_router_probe,
        "Base-relative reconstruction vs router probe\n(grey ticks: each cell's chance level)",
    )
    fig.axes[0].axvline(1.0, color="0.5", ls="--", lw=0.8)
    if "within_task_router_probe_chance" in df.columns:  # the probe's chance level under each point
        fig.axes[0].scatter(
            df[M.base_relative_reconstruction],
            df["within_task_router_probe_chance"],
            marker="_",
            s=120,
            color="0.5",
            label="chance",
        )
    return fig


def inferred_scale(t):
    s = t.get("reference_scale", pd.DataFrame())
    if s.empty:
        return None
    is_ratio = s.aggregation_mode.str.contains("_ratio")
    bars, ratios = s[~is_ratio].copy(), s[is_ratio]
    bars["bar"] = (
        bars.source.str.replace("primary arm", "primary")
        + "\n("
        + bars.aggregation_mode.str.split("_comparison").str[0].str.split(" ").str[0]
        + ")"
    )
    fig, ax = plt.subplots(figsize=(max(5.5, 1.8 * len(bars) + 1), 4.2))
    sns.barplot(data=bars, x="bar", y="mean", ax=ax, errorbar=None, color="tab:blue")
    ax.errorbar(range(len(bars)), bars["mean"], yerr=bars["std"], fmt="none", ecolor="0.2", capsize=3)
    for i, v in enumerate(bars["mean"]):
        ax.annotate(f"{v:.4g}", (i, v), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ratio_text = "\n".join(f"{r.source.replace('derived: ', '')}: {r['mean']:.4g}x" for _, r in ratios.iterrows())
    ax.set(xlabel="", ylabel="S_ref = raw / base-relative (log)", title="Inferred z-free reference scale")
    if ratio_text:
        ax.text(
            0.98,
            0.95,
            ratio_text,
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"},
        )
    plt.setp(ax.get_xticklabels(), fontsize=8)
    fig.tight_layout()
    return fig


def dynamics(t, metrics: list[str], title: str):
    """One panel per metric (rows) and arm of the primary contrast (columns), one line per setting."""
    h = history_rows(t)
    if h.empty:
        return None
    metrics = [m for m in metrics if (h.metric == m).any()]
    if not metrics:
        return None
    arms = drawn_arms(t, h)
    fig, axes = plt.subplots(
        len(metrics), len(arms), figsize=(5.5 * len(arms) + 1.5, 3.6 * len(metrics)), squeeze=False, sharey="row"
    )
    for i, m in enumerate(metrics):
        for j, arm in enumerate(arms):
            ax = axes[i][j]
            sns.lineplot(
                data=h[(h.metric == m) & (h.arm == arm)],
                x="step",
                y="value",
                hue=FAM,
                style=BETA,
                ax=ax,
                errorbar="sd",
                legend=i == 0 and j == len(arms) - 1,
            )
            ax.set(ylabel=history_label(m), title=f"{arm}: {history_label(m)}", xlabel="step (0 = initialization)")
    axes[0][-1].legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def trajectory(t):
    """Each cell's path through (base-relative reconstruction, matched router score), one panel
    per arm of the primary contrast."""
    h = history_rows(t)
    if h.empty:
        return None
    w = h[h.metric.isin([M.base_relative_reconstruction, "scored_matched_router_score"])]
    w = w.pivot_table(index=["cell_id", "arm", "step", FAM, BETA], columns="metric", values="value").reset_index()
    if not _need(w, M.base_relative_reconstruction, "scored_matched_router_score"):
        return None
    arms = drawn_arms(t, w)
    fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms) + 1.5, 4.5), squeeze=False, sharex=True, sharey=True)
    for j, (ax, arm) in enumerate(zip(axes[0], arms)):
        a = w[w.arm == arm].sort_values("step")
        sns.lineplot(
            data=a,
            x=M.base_relative_reconstruction,
            y="scored_matched_router_score",
            hue=FAM,
            style=BETA,
            units="cell_id",
            estimator=None,
            sort=False,
            marker="o",
            markersize=3,
            ax=ax,
            legend=j == len(arms) - 1,
        )
        start = a[a.step == a.step.min()]
        ax.scatter(start[M.base_relative_reconstruction], start.scored_matched_router_score, marker="x", color="k",
                   label="first checkpoint", zorder=5)  # fmt: skip
        ax.set_xscale("log")
        ax.set(
            xlabel=label(M.base_relative_reconstruction) + " (log)",
            ylabel=history_label("scored_matched_router_score"),
            title=arm,
        )
    axes[0][-1].legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8, frameon=False)
    fig.suptitle("Reconstruction-router trajectory")
    fig.tight_layout()
    return fig


def per_task_router(t):
    h = history_rows(t, "history_per_task_long")
    if h.empty or not (h.metric == "scored_matched_router_score").any():
        return None
    h = h[h.metric == "scored_matched_router_score"]
    tasks = sorted(h.task.unique())
    n = len(tasks)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols + 1.5, 3.4 * rows), squeeze=False, sharey=True)
    for i, task in enumerate(tasks):
        ax = axes[i // cols][i % cols]
        sns.lineplot(data=h[h.task == task], x="step", y="value", hue="arm", ax=ax, errorbar="sd", legend=i == 0)
        ax.set(title=task, ylabel=history_label("scored_matched_router_score"), xlabel="step")
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center right", fontsize=8, frameon=False)
    axes[0][0].get_legend().remove()
    fig.suptitle("Per-task matched router score (validation; mean and SD over an arm's cells)")
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return fig


def token_dominance(t):
    d = t.get("token_dominance", pd.DataFrame())
    if d.empty:
        return None
    long = d.melt(
        id_vars=["token_aggregation", "checkpoint", "task"],
        value_vars=[m for m in SHARE_METRICS if m in d.columns],
        var_name="share",
        value_name="value",
    )
    long["panel"] = long.token_aggregation + " | " + long.checkpoint
    panels = list(dict.fromkeys(long.panel))
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols + 1.5, 3.6 * rows), squeeze=False, sharey=True)
    for i, p in enumerate(panels):
        ax = axes[i // cols][i % cols]
        sns.barplot(data=long[long.panel == p], x="task", y="value", hue="share", ax=ax, errorbar=None)
        ax.set(title=p, xlabel="", ylabel="share of total")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
        if ax.get_legend():
            ax.get_legend().remove()
    for j in range(len(panels), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center right", fontsize=8, frameon=False)
    fig.suptitle("Token-count dominance per task (shares sum to 1 per panel and share kind)")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return fig


def endpoint_by_cell(t):
    """The primary endpoint (the declared metric) per cell: one panel per beta, families along x,
    arms side by side, 95% intervals (test inputs), the marker naming the cell's state."""
    m = endpoint(t)
    s, st = t.get("summary", pd.DataFrame()), t.get("cell_states", pd.DataFrame())
    if not _need(s, m) or "arm" not in s.columns:
        return None
    df = s.merge(st[["cell_id", "state"]], on="cell_id", how="left") if not st.empty else s.assign(state="unknown")
    betas = list(dict.fromkeys(df.beta_label))
    fams = list(dict.fromkeys(df.family_label))
    arms = list(dict.fromkeys(df.arm))
    markers = {"empty": "o", "strategy": "D", "other": "X", "unknown": "s"}
    fig, axes = plt.subplots(1, len(betas), figsize=(3.6 * len(betas) + 1.5, 3.8), sharey=True, squeeze=False)
    colors = dict(zip(arms, sns.color_palette(n_colors=len(arms))))
    for ax, beta in zip(axes[0], betas):
        g = df[df.beta_label == beta]
        for j, arm in enumerate(arms):
            a = g[g.arm == arm]
            x = np.array([fams.index(f) for f in a.family_label]) + (j - (len(arms) - 1) / 2) * 0.25
            x = x + 0.04 * a.groupby("family_label").cumcount().to_numpy()  # seeds side by side
            ax.errorbar(x, a[m], yerr=_err(a, m), fmt="none", ecolor=colors[arm], elinewidth=0.8, capsize=2)
            for state, marker in markers.items():
                sel = (a.state == state).to_numpy()
                if sel.any():
                    ax.scatter(x[sel], a[m][sel], marker=marker, color=colors[arm], s=36)
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_xticks(range(len(fams)), fams, rotation=30, ha="right", fontsize=8)
        ax.set(title=beta, xlabel="", xlim=(-0.6, len(fams) - 0.4))
    axes[0][0].set_ylabel(label(m))
    handles = [plt.Line2D([], [], color=colors[a], marker="o", ls="", label=a) for a in arms]
    handles += [plt.Line2D([], [], color="0.3", marker=marker, ls="", label=s) for s, marker in markers.items()]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(f"{label(m)} per cell (the primary endpoint; 95% intervals over test inputs)")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return fig


# file name -> (title, maker)
FIGURES = {
    "primary_contrast": ("The primary contrast", primary_contrast_forest),
    "endpoint_by_cell": ("The primary endpoint per cell", endpoint_by_cell),
    "objective_scale_heatmap": ("Mean-versus-sum objective scale", objective_scale_heatmap),
    "kl_vs_reconstruction": ("KL-to-reconstruction trade-off", kl_vs_reconstruction),
    "kl_reconstruction_ratio": ("KL/reconstruction ratio", kl_recon_ratio),
    "base_relative_vs_router": ("Base-relative reconstruction versus router probe", base_relative_vs_router),
    "inferred_scale": ("Inferred z-free reference scale", inferred_scale),
    "posterior_router_gap": ("Posterior-router gap", posterior_router_gap),
    "dynamics_base_relative": (
        "Base-relative reconstruction dynamics",
        lambda t: dynamics(t, [M.base_relative_reconstruction], "Validation dynamics"),
    ),
    "dynamics_active_objective": (
        "Active reconstruction objective dynamics",
        lambda t: dynamics(t, [M.active_reconstruction_objective], "Validation dynamics"),
    ),
    "dynamics_kl": ("KL dynamics", lambda t: dynamics(t, [M.kl_prior_loss], "Validation dynamics")),
    "dynamics_kl_ratio": (
        "KL/reconstruction ratio dynamics",
        lambda t: dynamics(t, [M.kl_over_active_reconstruction], "Validation dynamics"),
    ),
    "dynamics_probes": (
        "Router and posterior probe dynamics",
        lambda t: dynamics(t, ["scored_router_probe", M.posterior_probe], "Validation probes"),
    ),
    "reconstruction_router_trajectory": ("Reconstruction-router trajectory", trajectory),
    "per_task_router_dynamics": ("Per-task router dynamics", per_task_router),
    "token_count_dominance": ("Token-count dominance", token_dominance),
}


# The questions the figures answer, in the order the HTML report groups them
QUESTIONS = (
    "The endpoint: does the router carry the strategy?",
    "The objective's scale: how do sum and mean weigh KL against reconstruction?",
    "Dynamics: when does the latent start, and does it stay?",
    "Token-count dominance: do long traces dominate the sum?",
)


@dataclass(frozen=True)
class FigureNote:
    """A figure's caption in the HTML report: the question it answers (QUESTIONS index), what is
    plotted and how to read it, and the summary column whose per-arm values the caption quotes
    for the collection at hand (None: no summary number)."""

    question: int
    text: str
    metric: str | None
    frame: str | None = None  # frames.FRAMES: the rows the figure draws, whose numbers the caption quotes

    def __post_init__(self):
        assert self.frame is None or self.frame in FRAMES, self


# file name (FIGURES) -> its caption
FIGURE_NOTES = {
    "primary_contrast": FigureNote(
        0,
        "The headline's contrast, setting by setting: each common setting's paired delta (primary minus "
        "comparison arm, the mean over its replicates) with its 95% interval, and the grid mean with the "
        "headline's interval; the grey band is the smallest difference the collection could detect. A mean "
        "interval clear of 0 is the verdict; settings on both sides of 0 are what its interval weighs.",
        None,
    ),
    "endpoint_by_cell": FigureNote(
        0,
        "The primary endpoint (`report.primary_metric`) per cell, with its 95% interval over test inputs, one "
        "panel per beta, the arms side by side, the marker naming the cell's state. For router information "
        "(the default): the share of the strategy's entropy the router's z tells about which strategy a "
        "generation follows (out-of-fold probe); above 0 with the interval, the router carries the strategy.",
        ENDPOINT_NOTE,
        "cells",
    ),
    "base_relative_vs_router": FigureNote(
        0,
        "Per setting and arm, the final base-relative reconstruction (reconstruction over the z-free "
        "reference's; 1 = z helps nothing, dashed line) against the within-task router probe, the probe's "
        "chance level as a grey tick under each point. Left of 1: z is used; above the tick: the router "
        "predicts the strategy. Left but at chance: z carries something other than the strategy.",
        M.base_relative_reconstruction,
        "settings",
    ),
    "posterior_router_gap": FigureNote(
        0,
        "Posterior probe minus router probe per family and beta (primary arm): how much more the posterior "
        "q(z|x,y) tells about the strategy than the router p(z|x). A large gap: the strategy is in z but the "
        "router does not predict it.",
        M.posterior_router_probe_gap,
        "primary_settings",
    ),
    "objective_scale_heatmap": FigureNote(
        1,
        "Primary minus comparison arm per common setting (family and beta, columns), one row per metric: the "
        "annotations are the deltas, the colors each delta over its interval's half-width, one scale for every "
        "row centred on 0 (red: the primary arm higher; beyond 1 the interval clears 0, pale is inside the "
        "noise). Under `sum` the reconstruction objective grows with the tokens of a trace, so its rows show "
        "by how much the sum arm weighs reconstruction against the KL more.",
        None,
    ),
    "kl_vs_reconstruction": FigureNote(
        1,
        "KL to the prior (y) against the active reconstruction objective (x) per setting and arm: the trade-off "
        "beta sets. A setting at KL near 0 does not use z (`empty`); the higher, the more information z carries.",
        M.kl_prior_loss,
        "settings",
    ),
    "kl_reconstruction_ratio": FigureNote(
        1,
        "KL over the active reconstruction objective per family (bars) and beta (colors), primary arm: the "
        "size of the KL against the reconstruction it buys.",
        M.kl_over_active_reconstruction,
        "primary_settings",
    ),
    "inferred_scale": FigureNote(
        1,
        "The z-free reference scale S_ref = raw reconstruction / base-relative reconstruction per source and "
        "aggregation (log axis, mean and SD), with the ratios between them in the box: the factor between a "
        "token sum and a sequence mean on these data (about the mean trace length).",
        None,
    ),
    "dynamics_base_relative": FigureNote(
        2,
        "Validation base-relative reconstruction over training steps, one panel per arm, one line per "
        "setting: 1 at step 0 (the cell starts as the entangled model), dropping where the latent starts (the onset).",
        M.base_relative_reconstruction,
        "history",
    ),
    "dynamics_active_objective": FigureNote(
        2,
        "The active reconstruction objective over training steps, per cell.",
        M.active_reconstruction_objective,
        "history",
    ),
    "dynamics_kl": FigureNote(
        2,
        "KL to the prior over training steps, per cell: it rises when z starts to carry information; a cell "
        "that stays near 0 never starts.",
        M.kl_prior_loss,
        "history",
    ),
    "dynamics_kl_ratio": FigureNote(
        2,
        "KL over the active reconstruction objective over training steps, per cell.",
        M.kl_over_active_reconstruction,
        "history",
    ),
    "dynamics_probes": FigureNote(
        2,
        "The router and posterior probe scores on validation over training steps, per cell: the router "
        "follows the posterior once the latent carries the strategy.",
        "scored_router_probe",
        "history",
    ),
    "reconstruction_router_trajectory": FigureNote(
        2,
        "Each cell's path through (base-relative reconstruction, log x; matched router score, y) over its "
        "validation checkpoints, the first marked x: left first (z used), then up (the router predicts the "
        "strategy).",
        "scored_matched_router_score",
        "history",
    ),
    "per_task_router_dynamics": FigureNote(
        2,
        "The matched router score on validation per task over training steps: which tasks' strategies the "
        "router learns first.",
        "scored_matched_router_score",
        "history_per_task",
    ),
    "token_count_dominance": FigureNote(
        3,
        "Per task, its share of examples, tokens, loss and gradient norm in a batch, per aggregation: under "
        "`sum` the tasks with long traces take a share of the loss and gradient above their share of examples.",
        None,
    ),
}


def make_figures(t: dict, fig_dir: str | Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Write every figure whose data exists. Returns (made [(name, title)], skipped [(name, title)])."""
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    made, skipped = [], []
    for name, (title, maker) in FIGURES.items():
        fig = maker(t)
        if fig is None:
            skipped.append((name, title))
            continue
        with atomic_path(fig_dir / f"{name}.png", suffix=".png") as tmp:
            # the canvas grows to hold every title, label and outside legend: nothing is cut off
            fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight", pad_inches=0.1)
        plt.close(fig)
        made.append((name, title))
    return made, skipped
