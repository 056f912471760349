"""The entangled model's quality report (entangle/quality.json) as a table: written by the
entangle stage (quality.parquet) and read by the report. Pandas only, so the report needs no
torch."""
from __future__ import annotations

import pandas as pd

QUALITY_COLUMNS = ["task", "check", "value", "threshold", "direction", "passed", "n"]


def quality_table(report: dict) -> pd.DataFrame:
    """One row per task x check: value, threshold, direction (min / max), passed, samples."""
    rows = [dict(task=t, check=c, value=v["value"], threshold=v["threshold"], direction=v["direction"],
                 passed=v["passed"], n=r["n"])
            for t, r in report["tasks"].items() for c, v in r["checks"].items()]
    return pd.DataFrame(rows, columns=QUALITY_COLUMNS)
