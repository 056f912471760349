"""The entangled model's quality check: is it a real multi-strategy model? (design sections 3
and 5.2, docs/design.md). Samples at temperature 1 on validation inputs (decode.generate_zfree),
scored by the tasks' verifier and matcher (scoring.score_generations), per task: answer
accuracy, strategy-match rate and the total variation between the strategies the samples
follow and the data's. The entangle stage writes quality.json (`write_quality`), the
quality.parquet table (`quality_table`) and the samples; the aggregate stage and the report
read quality.json (aggregate.inputs.load_entangle_quality) and import nothing from here.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat.io import dump_json, write_parquet
from latentstrat.metrics import M
from latentstrat.modeling.scoring import score_generations
from latentstrat.paths import ENTANGLE_FILES
from latentstrat.tasks import TASKS

# check name -> (config threshold key, direction): value must be >= (min) or <= (max) threshold
CHECKS = {
    "answer_accuracy": ("quality_min_answer_accuracy", "min"),
    M.strategy_match_rate: ("quality_min_strategy_match", "min"),
    "strategy_tv": ("quality_max_strategy_tv", "max"),
}
TEMPERATURE = 1.0
QUALITY_COLUMNS = ["task", "check", "value", "threshold", "direction", "passed", "n"]


class QualityError(RuntimeError):
    """The entangled model failed a quality check and entangle.quality_enforce is true."""


def strategy_distribution(match_sets, strategies) -> dict[str, float]:
    """Followed-strategy distribution over examples with >= 1 matching strategy. An example
    matching k strategies (an ambiguous trace) adds 1/k to each: a trace that several
    strategies produce is evidence for none of them in particular. None values: no match."""
    counts = {s: 0.0 for s in strategies}
    n = 0
    for m in match_sets:
        m = [s for s in m if s in counts]
        if not m:
            continue
        n += 1
        for s in m:
            counts[s] += 1.0 / len(m)
    return {s: (c / n if n else None) for s, c in counts.items()}


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def data_strategy_distributions(train_df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """The data's strategy distribution per task (train split, true traces' matching sets)."""
    return {
        task: strategy_distribution(g.matching_strategies, TASKS[task].strategies)
        for task, g in train_df.groupby("task", sort=True)
    }


def quality_report(samples: pd.DataFrame, data_dist: dict[str, dict[str, float]], thresholds: dict) -> dict:
    """Per-task checks of temperature-1 samples.

    samples: columns task, x, y_generated. data_dist: task -> strategy -> probability.
    thresholds: entangle config keys of CHECKS. Returns {"passed", "thresholds", "tasks": {task:
    {"n", "passed", "checks": {check: {value, threshold, passed}}, "followed_distribution",
    "data_distribution", "n_matched"}}}.
    """
    missing = [c for c in ("task", "x", "y_generated") if c not in samples.columns]
    if missing:
        raise ValueError(f"quality_report: samples lack columns {missing}")
    tasks = {}
    for name, g in samples.groupby("task", sort=True):
        if name not in data_dist:
            raise ValueError(f"quality_report: no data strategy distribution for task {name!r}")
        scored = score_generations(g, g.y_generated.tolist())
        matched = [m for m in scored.matched_strategies if m]
        followed = strategy_distribution(matched, TASKS[name].strategies)
        values = {
            "answer_accuracy": float(np.mean(scored.correct.to_numpy())),
            M.strategy_match_rate: len(matched) / len(g),
            # no matched sample: nothing follows the data's strategies -> maximal distance
            "strategy_tv": total_variation(followed, data_dist[name]) if matched else 1.0,
        }
        checks = {}
        for check, (key, direction) in CHECKS.items():
            v, thr = values[check], float(thresholds[key])
            checks[check] = dict(
                value=v, threshold=thr, direction=direction, passed=bool(v >= thr if direction == "min" else v <= thr)
            )
        tasks[name] = dict(
            n=int(len(g)),
            n_matched=len(matched),
            checks=checks,
            passed=all(c["passed"] for c in checks.values()),
            followed_distribution=followed,
            data_distribution=data_dist[name],
        )
    return dict(
        passed=bool(tasks) and all(t["passed"] for t in tasks.values()),
        thresholds={k: float(thresholds[k]) for k, _ in CHECKS.values()},
        tasks=tasks,
    )


def quality_table(report: dict) -> pd.DataFrame:
    """One row per task x check: value, threshold, direction (min / max), passed, samples."""
    rows = [
        dict(
            task=t,
            check=c,
            value=v["value"],
            threshold=v["threshold"],
            direction=v["direction"],
            passed=v["passed"],
            n=r["n"],
        )
        for t, r in report["tasks"].items()
        for c, v in r["checks"].items()
    ]
    return pd.DataFrame(rows, columns=QUALITY_COLUMNS)


def check_quality(
    model, tokenizer, val_df: pd.DataFrame, train_df: pd.DataFrame, ecfg: dict, batch_size: int
) -> tuple[dict, pd.DataFrame]:
    """Sample at temperature 1 on up to `quality_samples_per_task` validation inputs per task
    and run the checks (the test split is read by the evaluate stage only). Returns (report,
    samples)."""
    from latentstrat.modeling.decode import Decoding, generate_zfree

    n = ecfg["quality_samples_per_task"]
    inputs = val_df.groupby("task", sort=True, group_keys=False).head(n).reset_index(drop=True)
    max_new = int(max(train_df.n_supervised.max(), val_df.n_supervised.max())) + 8
    decoding = Decoding(max_new, batch_size, TEMPERATURE, ecfg["seed"])
    texts = generate_zfree(model, tokenizer, inputs.x.tolist(), ecfg["z_slots"], decoding)
    samples = inputs[["task", "example_id", "strategy", "x", "y"]].assign(y_generated=texts)
    report = quality_report(samples, data_strategy_distributions(train_df), ecfg)
    report.update(temperature=TEMPERATURE, samples_per_task=n, max_new_tokens=max_new)
    return report, samples


def write_quality(model, tokenizer, val_df, train_df, ecfg: dict, out_dir: Path, log=print, **record) -> dict:
    """Run the quality checks, write quality.json / quality.parquet / quality_samples.parquet
    (with `record` in quality.json), log them, and fail when they fail and are enforced."""
    t0 = time.time()
    report, samples = check_quality(model, tokenizer, val_df, train_df, ecfg, batch_size=2 * ecfg["batch_size"])
    report.update(quality_s=time.time() - t0, **record)
    dump_json(report, out_dir / ENTANGLE_FILES["quality"])
    write_parquet(quality_table(report), out_dir / "quality.parquet")
    write_parquet(samples, out_dir / "quality_samples.parquet")
    for task, r in report["tasks"].items():
        log(
            f"quality {task}: "
            + ", ".join(f"{c} {v['value']:.3f} ({'ok' if v['passed'] else 'FAIL'})" for c, v in r["checks"].items())
        )
    if not report["passed"] and ecfg["quality_enforce"]:
        failed = [
            f"{t}.{c}={v['value']:.3f}"
            for t, r in report["tasks"].items()
            for c, v in r["checks"].items()
            if not v["passed"]
        ]
        raise QualityError(
            f"entangle: quality checks failed ({', '.join(failed)}); report in {out_dir / ENTANGLE_FILES['quality']}"
        )
    return report
