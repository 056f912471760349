"""Collection aggregate: per-cell metrics + histories -> the tables the report reads.

One module per step of the data flow (docs/architecture.md, "Aggregate"):

- `inputs`: read cell metrics (and each cell's state), external summary / comparison tables,
  histories, bootstrap replicates, the entangle stage's quality report;
- `settings`: cells -> setting rows (seed means, 95% intervals), distributions, top/bottom rows;
- `contrasts`: primary arm vs each comparison arm: common cells, arm contrasts and verdicts,
  the inferred z-free reference scale per arm;
- `dynamics`: histories -> dynamics summary, per-task checkpoints, token-count dominance,
  gradient clipping;
- `sanity`: the cell sanity check and the `cell_check` mark on every table naming cells;
- `fairness`: collection metadata, fairness claims, attribution, data availability;
- `followup`: what a cell cost and the seeds a `cannot tell` needs;
- `collection`: the driver (`aggregate_collection`, `aggregate_from_tables`, `aggregate_tables`);
- `columns`: the names the tables and the report share.

Conventions: the primary arm is the ablated arm (e.g. `sum`); a comparison arm is run here or
read from an external comparison summary table (columns in docs/comparison-table.md). Deltas
are primary minus comparison arm. "Reference" names only the z-free reference stage (its scales
and per-token NLL b), never a comparison arm.
"""
