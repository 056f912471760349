"""A report from summary tables alone (columns in docs/comparison-table.md): writes DIR/aggregate/
and the report into DIR. With --configfile (the collection config the tables came from), a `cannot
tell` that more seeds would settle gets DIR/followup.yaml, which extends that config.

    python -m latentstrat.report --summary S [--comparison C ...] [--history H] [--configfile CFG] --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from latentstrat.aggregate.collection import aggregate_from_tables
from latentstrat.report import build_report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.report", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--summary", required=True, help="primary-arm summary table (CSV or parquet)")
    ap.add_argument(
        "--comparison", action="append", default=[], help="comparison arm summary table; repeatable (arm = file stem)"
    )
    ap.add_argument("--history", help="long history table: cell_id, step, task, metric, value")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--title", default="", help="the report's title (default: from the collection)")
    ap.add_argument("--top-k", type=int, default=5, help="rows in the top / bottom cell tables")
    ap.add_argument("--configfile", help="the collection config the tables came from (enables followup.yaml)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    try:
        aggregate_from_tables(
            a.summary, a.comparison, a.history, out / "aggregate", top_k=a.top_k, config_path=a.configfile
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    res = build_report(out / "aggregate", out, {"title": a.title} if a.title else {})
    print(
        f"report written to {out} in {res['seconds']:.1f} s ({len(res['figures'])} figures, {len(res['skipped'])} "
        "skipped)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
