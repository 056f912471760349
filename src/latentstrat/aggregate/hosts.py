"""Whether the two cells of each pair trained on the same kind of machine: a pair cancels what
its setting and seed do to both cells only when the machine, device, torch and code are the same
(a cell's numbers move with its CPU's capability). The headline reads `cannot tell (pair mixes
hosts)` otherwise, unless the config accepts it (report/headline.py)."""

from __future__ import annotations

import pandas as pd

from latentstrat.cells import format_value


def seed_order(seed: str):
    return (len(seed), seed)


# what the two cells of a pair must share for the pairing to cancel anything: the same machine
# kind, device, torch and code (a cell's step differs by 2x between CPU capabilities, and its
# numbers with them); summary columns as tabulate records them
PAIR_HOST = {
    "train_cpu_capability": "CPU capability",
    "train_device": "device",
    "train_torch_version": "torch",
    "train_code_version": "code version",
}


def pair_host_mix(p, c, cells: dict | None) -> str:
    """How the cells of a setting's pairs (one replicate seed in both arms; an arm with seeds of
    its own pairs by replicate order) differ in PAIR_HOST, e.g. `seed 314160: CPU capability
    AVX2 vs AVX-512`; '' when every pair shares them (or nothing is recorded to compare)."""
    if not cells:
        return ""

    def ids(row):
        return [i for i in str(row.get("cell_ids", row.get("cell_id", ""))).split(",") if i in cells]

    pc, cc = [cells[i] for i in ids(p)], [cells[i] for i in ids(c)]
    seeds_p, seeds_c = [format_value(r.get("seed", "")) for r in pc], [format_value(r.get("seed", "")) for r in cc]

    def in_order(rows, seeds):
        return sorted(zip(seeds, rows), key=lambda t: seed_order(t[0]))

    if set(seeds_p) == set(seeds_c):
        by_c = dict(zip(seeds_c, cc))
        pairs = [(s, a, by_c[s]) for s, a in zip(seeds_p, pc)]
    else:
        pairs = [(s, a, b) for (s, a), (_, b) in zip(in_order(pc, seeds_p), in_order(cc, seeds_c))]
    out = []
    for seed, a, b in pairs:
        diff = [
            f"{what} {format_value(a.get(k))} vs {format_value(b.get(k))}"
            for k, what in PAIR_HOST.items()
            if pd.notna(a.get(k)) and pd.notna(b.get(k)) and a.get(k) != b.get(k)
        ]
        if diff:
            out.append(f"seed {seed}: " + ", ".join(diff))
    return "; ".join(out)
