"""The data stage's card: per task, examples per split, strategies, ambiguity and y-token
statistics (data_card.parquet), and the same as markdown with one example per task and strategy
(data_card.md)."""

from __future__ import annotations

import pandas as pd

from latentstrat.tasks import TASKS


def data_card(df: pd.DataFrame, splits) -> pd.DataFrame:
    """One row per task: examples per split (`splits`: their names), strategies, ambiguity rate,
    y-token stats."""
    rows = []
    for name, g in df.groupby("task", sort=True):
        n = g.n_y_tokens
        row = dict(task=name, strategies=", ".join(TASKS[name].strategies), n_strategies=len(TASKS[name].strategies))
        for s in splits:
            row[f"n_{s}"] = int((g.split == s).sum())
        row.update(
            ambiguity_rate=float(g.ambiguous.mean()),
            n_ambiguous=int(g.ambiguous.sum()),
            y_tokens_mean=float(n.mean()),
            y_tokens_std=float(n.std(ddof=0)),
            y_tokens_min=int(n.min()),
            y_tokens_median=float(n.median()),
            y_tokens_max=int(n.max()),
            record_tokens_max=int((g.x.str.split().str.len() + n).max() + 10),
            strategy_counts=", ".join(f"{k}:{v}" for k, v in sorted(g.strategy.value_counts().items())),
        )
        for s in TASKS[name].strategies:
            row[f"y_tokens_mean[{s}]"] = float(n[g.strategy == s].mean()) if (g.strategy == s).any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def data_card_markdown(card: pd.DataFrame, df: pd.DataFrame) -> str:
    lines = [
        "# Data card",
        "",
        f"{len(df)} examples, {card.shape[0]} tasks. Splits are disjoint by input x within each task; "
        "strategy labels are uniform per example. `ambiguous`: the true trace matches more than one "
        "strategy (left out of probe labels). y tokens: word-level tokens of the trace + final answer "
        "(supervised tokens = y tokens + 2). Record tokens max includes the 10 special tokens of the "
        "record with one z slot.",
        "",
        "| task | strategies | train | validation | test | ambiguity rate | y tokens mean | std | min | median | "
        "max | record tokens max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in card.itertuples(index=False):
        lines.append(
            f"| {r.task} | {r.strategies} | {r.n_train} | {r.n_validation} | {r.n_test} | "
            f"{r.ambiguity_rate:.2%} | {r.y_tokens_mean:.1f} | {r.y_tokens_std:.1f} | {r.y_tokens_min} | "
            f"{r.y_tokens_median:g} | {r.y_tokens_max} | {r.record_tokens_max} |"
        )
    m = card.y_tokens_mean
    lines += [
        "",
        f"Longest / shortest mean y: {m.max():.1f} / {m.min():.1f} = {m.max() / m.min():.2f}x.",
        "",
        "## One example per task and strategy (train split)",
        "",
    ]
    train = df[df.split == "train"]
    for name in card.task:
        lines.append(f"### {name}")
        lines.append("")
        for s in TASKS[name].strategies:
            ex = train[(train.task == name) & (train.strategy == s)].head(1)
            for r in ex.itertuples(index=False):
                lines.append(f"- {s}: `{r.x}` -> `{r.y}`")
        lines.append("")
    return "\n".join(lines)
