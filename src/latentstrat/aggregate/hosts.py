"""Whether the two cells of each pair ran on one machine and one code: a pair cancels what its
setting and seed do to both cells only when both trained, were evaluated and were probed on the
same CPU model and capability, device, torch and code content (a cell's numbers move with its CPU:
the same quick cells read 0.745 on one CPU and 0.600 on another). A pair that differs mixes
hosts; a pair where either cell did not record one of these is unknown. Either makes the headline
read `cannot tell`, unless the config accepts it (report/headline.py)."""

from __future__ import annotations

import json
import math

from latentstrat.cells import format_value


def seed_order(seed: str):
    return (len(seed), seed)


# what the two cells of a pair must share, per stage, as tabulate records it: train_* from the
# train summary's host segments (every machine a resumed cell trained on), evaluate_* and
# probes_* from their tables' metadata
PAIR_HOST = {
    "train": {
        "cpu": "CPU",
        "cpu_capability": "CPU capability",
        "device": "device",
        "torch_version": "torch",
        "code_hash": "code",
    },
    "evaluate": {"cpu": "CPU", "code_hash": "code"},
    "probes": {"cpu": "CPU", "code_hash": "code"},
}


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v == ""


def _segments(cell) -> list[dict]:
    """The machines a cell trained on: its train summary's host segments, else the one machine
    its summary's train_* columns name (cells from before segments were recorded)."""
    raw = cell.get("train_hosts")
    if not _missing(raw):
        segs = json.loads(raw) if isinstance(raw, str) else list(raw)
        if segs:
            return segs
    return [{k: cell.get(f"train_{k}") for k in PAIR_HOST["train"]}]


def stage_hosts(cell) -> dict[tuple[str, str], tuple | None]:
    """(stage, field) -> the values the cell's stage ran with, in order (more than one: it moved
    between machines while training), None where not recorded."""
    out = {}
    segs = _segments(cell)
    for k in PAIR_HOST["train"]:
        vals = [s.get(k) for s in segs]
        out[("train", k)] = None if any(_missing(v) for v in vals) else tuple(dict.fromkeys(vals))
    for stage in ("evaluate", "probes"):
        for k in PAIR_HOST[stage]:
            v = cell.get(f"{stage}_{k}")
            out[(stage, k)] = None if _missing(v) else (v,)
    return out


def _show(vals: tuple) -> str:
    return " then ".join(format_value(v) for v in vals)


def pair_problems(a_id: str, a, b_id: str, b) -> tuple[list[str], list[str]]:
    """(how the two cells' machines differ, what either did not record), each e.g. `train CPU
    AMD EPYC vs Intel Xeon`, `evaluate code of c2 not recorded`, `c1 moved while training (CPU A then B)`."""
    ha, hb = stage_hosts(a), stage_hosts(b)
    mix, unknown = [], []
    for stage, fields in PAIR_HOST.items():
        for k, what in fields.items():
            va, vb = ha[(stage, k)], hb[(stage, k)]
            gone = [i for i, v in ((a_id, va), (b_id, vb)) if v is None]
            if gone:
                unknown.append(f"{stage} {what} of {', '.join(gone)} not recorded")
                continue
            moved = [f"{i} moved while training ({what} {_show(v)})" for i, v in ((a_id, va), (b_id, vb)) if len(v) > 1]
            if moved:
                mix.extend(moved)
            elif va != vb:
                mix.append(f"{stage} {what} {_show(va)} vs {_show(vb)}")
    return mix, unknown


def _pairs(p, c, cells: dict) -> list[tuple[str, str, str]]:
    """(seed, primary cell id, comparison cell id) of a setting's pairs: one replicate seed in both
    arms; an arm with seeds of its own pairs by replicate order."""

    def ids(row):
        return [i for i in str(row.get("cell_ids", row.get("cell_id", ""))).split(",") if i in cells]

    pi, ci = ids(p), ids(c)
    sp = [format_value(cells[i].get("seed", "")) for i in pi]
    sc = [format_value(cells[i].get("seed", "")) for i in ci]
    if set(sp) == set(sc):
        by_c = dict(zip(sc, ci))
        return [(s, a, by_c[s]) for s, a in zip(sp, pi)]

    def in_order(i, s):
        return sorted(zip(s, i), key=lambda t: seed_order(t[0]))

    return [(s, a, b) for (s, a), (_, b) in zip(in_order(pi, sp), in_order(ci, sc))]


# a setting none of whose cells records any machine (summary tables from outside the pipeline):
# the check cannot run, which the verdict says (report/headline.py), rather than one missing field
NOT_RECORDED = "no host recorded"


def _records_nothing(cell) -> bool:
    return all(v is None for v in stage_hosts(cell).values())


def pair_host_check(p, c, cells: dict | None) -> tuple[str, str]:
    """(how the pairs of a setting mix hosts, what they leave unknown), each `seed S: ...; seed
    T: ...`, '' where none; unknown is NOT_RECORDED where no cell of the setting records any
    machine (or there are no cell rows)."""
    pairs = _pairs(p, c, cells) if cells else []
    if all(_records_nothing(cells[a]) and _records_nothing(cells[b]) for _, a, b in pairs):
        return "", NOT_RECORDED
    mixes, unknowns = [], []
    for seed, a, b in pairs:
        mix, unknown = pair_problems(a, cells[a], b, cells[b])
        if mix:
            mixes.append(f"seed {seed}: " + ", ".join(mix))
        if unknown:
            unknowns.append(f"seed {seed}: " + ", ".join(unknown))
    return "; ".join(mixes), "; ".join(unknowns)
