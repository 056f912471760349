"""Scoring of generated texts: the one place that judges a generation with its task's verifier
(`Task.final_answer_correct`) and strategy matcher (`Task.matching_strategies`). The evaluate
stage's records, the trainer's decoded validation subset and the entangled model's quality
check all score through `score_generations`. Pandas and the tasks only (no torch): the quality
check's report side reads it too.
"""

from __future__ import annotations

import pandas as pd

from latentstrat.tasks import TASKS


def score_generations(df: pd.DataFrame, texts: list[str]) -> pd.DataFrame:
    """Per row of `df` (columns task, x) and its generated y text: `correct` (the verifier
    accepts the final answer), `matched_strategies` (sorted: the strategies whose canonical
    trace the text is), `followed_strategy` (the one match, or None when none or several
    matched) and `generation_ambiguous` (several matched). Rows keep `df`'s order, on a fresh
    index."""
    correct, matched = [], []
    for task, x, y in zip(df.task, df.x, texts):
        t = TASKS[task]
        correct.append(bool(t.final_answer_correct(x, y)))
        matched.append(sorted(t.matching_strategies(x, y)))
    return pd.DataFrame(
        {
            "matched_strategies": matched,
            "followed_strategy": [m[0] if len(m) == 1 else None for m in matched],
            "generation_ambiguous": [len(m) > 1 for m in matched],
            "correct": correct,
        }
    )
