"""The headline's gates in the calibration harness (a `Scenario` with `gates`): a drawn collection's
cells carry the records the report's gates read (the machine and code of every stage, answer
accuracy, strategy match, a step-0 history), some pairs on another machine (`mixed_host_pairs`)
and some cells broken (`broken_cells`: answer accuracy far below the entangled model's), and the
headline (report.headline) is read beside the interval's verdict: a verdict over a pair that
mixes hosts, or over a broken cell, must read `cannot tell`; with neither, the two agree."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latentstrat.metrics import M

MACHINE = {
    "train_cpu": "AMD EPYC",
    "train_cpu_capability": "AVX-512 + native bf16",
    "train_device": "cpu",
    "train_torch_version": "2.13.0",
    "train_code_hash": "0123456789abcdef",
    **{
        f"{s}_{k}": v
        for s in ("evaluate", "probes")
        for k, v in (("cpu", "AMD EPYC"), ("code_hash", "0123456789abcdef"))
    },
}
ENTANGLED = {"answer_accuracy": 0.978, M.strategy_match_rate: 0.951, "n_tasks": 6}


def with_records(summary: pd.DataFrame, d: pd.DataFrame, sc, rng: np.random.Generator) -> pd.DataFrame:
    """The summary with every cell's machine, answer accuracy, strategy match and task counts; a
    share `sc.mixed_host_pairs` of pairs has its comparison cells trained on another CPU model, a
    share `sc.broken_cells` of cells answers 30% right."""
    s = summary.assign(**MACHINE)
    moved = rng.random(int(d.pair.max()) + 1) < sc.mixed_host_pairs
    other = moved[d.pair.to_numpy()] & (d.role.to_numpy() != "primary")
    s.loc[other, "train_cpu"] = "Intel Xeon"
    broken = rng.random(len(s)) < sc.broken_cells
    s[M.final_answer_accuracy] = np.where(broken, 0.3, 0.98)
    s[M.strategy_match_rate] = 0.97
    s["n_tasks"], s["within_task_router_probe_tasks"], s["within_task_router_probe_collapsed_tasks"] = 6, 6, 0
    return s


def headline_verdict(t: dict, summary: pd.DataFrame, thr: dict) -> str:
    """The headline's verdict on the drawn collection's tables `t`, its gates included."""
    from latentstrat.aggregate.sanity import cell_sanity
    from latentstrat.report.headline import headline

    # every cell starts as the entangled model: a step-0 history of base-relative reconstruction 1
    step0 = pd.DataFrame(
        {"cell_id": summary.cell_id, "step": 0, "metric": M.base_relative_reconstruction, "value": 1.0}
    )
    t = {**t, "cell_sanity": cell_sanity(summary, step0, ENTANGLED, thr)}
    primary = str(summary.loc[summary.role == "primary", "arm"].iloc[0])
    return str(headline(t, {"report": thr, "primary_metric": M.router_information, "primary_arm": primary})["verdict"])
