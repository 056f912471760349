"""Learning curves of one cell: what a budget buys (design section 5, stage 4).

    python -m latentstrat.bench curve --configfile config/config.yaml \\
        --cell token_aggregation=sum,reconstruction_family=dist_norm,beta=0.01 \\
        --set train.steps=600 --set train.batch_size=32 --eval-every 50
    python -m latentstrat.bench curve --collection --out results/curves/main    # the collection's own cells
    python -m latentstrat.bench curve --plot results/curves --figure docs/figures/learning-curves.png

Trains the cell exactly as the workflow's train job does (`train.train_cell`, the collection's
config with `--set` overrides) into `--out/<cell id>/`, validating every `--eval-every` steps,
and prints per checkpoint: examples seen, base-relative reconstruction, KL, the validation
router and posterior probes next to their chance levels, and answer accuracy on the decoded
subset. The table is also written as `curve.csv` beside the cell's history; a finished cell is
read back, not retrained, and so is the workflow's own cell when the config (with its
overrides) is the one the collection ran. The base (data, entangled model, reference) must exist: run the
collection's base jobs first (`snakemake --cores 2 <base>/reference/scales.json`, the command
says which path). `--plot` draws every `curve.csv` under a folder into one figure and prints
a Markdown table of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

from latentstrat import cells
from latentstrat.config import config_for_command
from latentstrat.metrics import M, history_name
from latentstrat.paths import TRAIN_FILES, Paths

# history metric -> curve column
COLUMNS = {
    M.base_relative_reconstruction: "base_relative",
    M.kl_prior_loss: "kl",
    "scored_router_probe": "router_probe",
    "scored_router_probe_chance": "router_chance",
    M.posterior_probe: M.posterior_probe,
    "posterior_probe_chance": "posterior_chance",
    M.final_answer_accuracy: "answer_accuracy",
    M.active_reconstruction_objective: "active",
    "clipped_fraction": "clipped_fraction",
}
CURVE_FILE = "curve.csv"


def parse_assignments(items: list[str], sep: str = "=") -> dict:
    """['train.steps=600', ...] -> nested dict with YAML-typed values."""
    out: dict = {}
    for item in items:
        if sep not in item:
            raise SystemExit(f"curve: expected key=value, got {item!r}")
        key, value = item.split(sep, 1)
        d = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = yaml.safe_load(value)
    return out


def curve_table(history: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """One row per validation checkpoint: step, examples seen and the COLUMNS metrics."""
    history = history.assign(metric=history.metric.map(history_name))
    h = history[(history.task == "all") & history.metric.isin(COLUMNS)]
    t = h.pivot_table(index="step", columns="metric", values="value", aggfunc="first").rename(columns=COLUMNS)
    t = t.reindex(columns=list(COLUMNS.values())).reset_index()
    t.insert(1, "examples_seen", t.step * batch_size)
    return t


def format_table(t: pd.DataFrame) -> str:
    cols = [
        "step",
        "examples_seen",
        "base_relative",
        "kl",
        "router_probe",
        "router_chance",
        M.posterior_probe,
        "posterior_chance",
        "answer_accuracy",
        "clipped_fraction",
    ]
    lines = ["| " + " | ".join(c.replace("_", " ") for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in t.iterrows():
        cells = [
            f"{int(r[c])}" if c in ("step", "examples_seen") else ("" if pd.isna(r[c]) else f"{r[c]:.3f}") for c in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def train_grad_clip_label(tcfg: dict) -> str:
    c = tcfg["grad_clip"]
    return "none" if c == 0 else f"{c} ({tcfg['grad_clip_unit']})" if not isinstance(c, dict) else str(c)


def run_curve(
    configfile: str, cell_overrides: dict, overrides: dict, eval_every: int, out: Path, threads: int
) -> pd.DataFrame:
    from latentstrat.cell import train  # heavy: only when training

    if eval_every:
        overrides = {**overrides, "train": {**overrides.get("train", {}), "eval_every": eval_every}}
    cfg = config_for_command(configfile, overrides=overrides)
    settings = {**cfg["cell"], **cell_overrides}
    unknown = sorted(set(cell_overrides) - set(cells.CELL_KEYS))
    if unknown:
        raise SystemExit(f"curve: unknown cell setting(s) {', '.join(unknown)} (known: {', '.join(cells.CELL_KEYS)})")
    settings = cells.normalize_settings({**cells.schema_cell_defaults(), **settings})
    cid = cells.cell_id(settings)
    paths = Paths.from_config(cfg)
    need = [Path(p) for p in (*paths.data_files().values(), *paths.reference_files().values())]
    missing = [p for p in need if not p.exists()]
    if missing or not (paths.entangle_dir / "model").is_dir():
        raise SystemExit(
            f"curve: the base of {configfile} is not built ({missing[0] if missing else paths.entangle_dir / 'model'} "
            f"is missing); run `snakemake --configfile {configfile} --cores 2 {paths.reference_files()['scales']}` "
            "first"
        )
    cell_dir = out / cid
    history_path = cell_dir / TRAIN_FILES["history"]
    trained = Path(paths.train_files(cid)["history"])  # the workflow's own cell, same config
    if not history_path.exists() and trained.exists():
        history_path = trained
    if not history_path.exists():
        train.train_cell(
            cfg,
            {"cell_id": cid, **settings},
            paths.base_folders,
            cell_dir,
            threads=threads,
        )
    tcfg = cfg["train"]
    t = curve_table(pd.read_parquet(history_path), int(tcfg["batch_size"]))
    t.insert(0, "cell_id", cid)
    for k in ("steps", "batch_size", "lr"):
        t[k] = tcfg[k]
    t["grad_clip"] = train_grad_clip_label(tcfg)
    t["lora_r"] = cfg["lora"]["r"]
    cell_dir.mkdir(parents=True, exist_ok=True)
    t.to_csv(cell_dir / CURVE_FILE, index=False)
    return t


def collection_curves(configfile: str, out: Path) -> list[str]:
    """curve.csv under `out` for every cell of the collection that its workflow has trained (read
    back from the train jobs' histories, nothing trained here). Returns the cells not trained yet."""
    cfg = config_for_command(configfile)
    paths = Paths.from_config(cfg)
    missing = []
    for c in cells.expand_cells(cfg):
        if not Path(paths.train_files(c.cell_id)["history"]).exists():
            missing.append(c.cell_id)
            continue
        run_curve(configfile, {k: c.settings[k] for k in cells.CELL_KEYS}, {}, None, out, 1)
    return missing


def plot_curves(folder: Path, figure: Path | None) -> pd.DataFrame:
    """Every curve.csv under `folder` -> one figure (base-relative reconstruction and router
    probe minus its chance level against examples seen) and the concatenated table."""
    frames = [pd.read_csv(p) for p in sorted(folder.rglob(CURVE_FILE))]
    if not frames:
        raise SystemExit(f"curve: no {CURVE_FILE} under {folder}")
    t = pd.concat(frames, ignore_index=True)
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(15, 5.2), constrained_layout=True)
        for (cid, lr, bs, clip), g in t.groupby(["cell_id", "lr", "batch_size", "grad_clip"], sort=True):
            label = f"{cid.replace('_seed-314159', '')} (lr {lr:g}, batch {bs}, clip {clip})"
            axes[0].plot(g.examples_seen, g.base_relative, marker="o", ms=3, label=label)
            axes[1].plot(g.examples_seen, g.router_probe - g.router_chance, marker="o", ms=3, label=label)
            axes[2].plot(g.examples_seen, g[M.posterior_probe] - g.posterior_chance, marker="o", ms=3, label=label)
        axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[0].set(
            title="base-relative reconstruction (validation)", xlabel="training examples seen", ylabel="1 = z-free"
        )
        for ax, name in ((axes[1], "router probe"), (axes[2], "posterior probe")):
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
            ax.set(title=f"{name} minus its chance level", xlabel="training examples seen", ylabel="accuracy - chance")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8)
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=110)
        plt.close(fig)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench curve", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", default="config/config.yaml", help="collection config whose cell is trained")
    ap.add_argument(
        "--cell",
        default="",
        help="cell settings over the config's `cell`, e.g. token_aggregation=mean,reconstruction_family=raw,beta=0.1",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. train.steps=600 (repeatable)",
    )
    ap.add_argument("--eval-every", type=int, default=None, help="validate every N steps (default: the config's)")
    ap.add_argument(
        "--out", type=Path, default=Path("results/curves"), help="folder for the curves (one parquet per cell)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument(
        "--collection",
        action="store_true",
        help="the curves of every cell the config's workflow has trained (read back, nothing trained)",
    )
    ap.add_argument("--plot", type=Path, help="draw every curve under this folder instead of training")
    ap.add_argument("--figure", type=Path, help="with --plot: where to save the figure")
    a = ap.parse_args(argv)
    if a.plot:
        t = plot_curves(a.plot, a.figure)
        for (cid, lr, bs, clip), g in t.groupby(["cell_id", "lr", "batch_size", "grad_clip"], sort=True):
            print(f"\n{cid}, lr {lr:g}, batch {bs}, gradient clipping {clip}\n\n{format_table(g)}")
        return 0
    if a.collection:
        missing = collection_curves(a.configfile, a.out)
        print(
            f"curves of the trained cells of {a.configfile} written under {a.out}"
            + (f"; not trained yet: {', '.join(missing)}" if missing else "")
        )
        return 0
    cell = parse_assignments([c for c in a.cell.split(",") if c]) if a.cell else {}
    t = run_curve(a.configfile, cell, parse_assignments(a.set), a.eval_every, a.out, a.threads)
    print(
        f"\n{t.cell_id[0]} (lr {t.lr[0]:g}, batch {t.batch_size[0]}, LoRA r {t.lora_r[0]}, "
        f"gradient clipping {t.grad_clip[0]})\n"
    )
    print(format_table(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
