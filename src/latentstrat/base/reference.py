"""Reference stage: the frozen z-free model's per-token NLL b_it = -log p_ref(y_t | x, y_<t)
for every supervised token of every example of every split, computed once (design section 4, docs/design.md).

    python -m latentstrat.base.reference --configfile config/config.yaml [--threads N]

Writes to `out_dir`:
- `tokens.parquet`        task, example_id, split, n_supervised, b (list<float32>, aligned
                          with the supervised tokens: y tokens, `</y>`, `<eos>`)
- `scales.json`           n_bar (mean n_supervised over train); per aggregation S_ref and, per
                          tokcc exponent a (0.25 and every a in the config's families), T_ref;
                          all from the validation split (objective.reference_scales)
- `token_counts.parquet`  per task and split: examples, supervised tokens mean/sum, b mean
                          (per token) and b per example (mean of sum_t b)

The entangled model is `<entangle_dir>/model/`; with `entangle.mode: skip` it is the backbone
as is (`backbone.build_backbone`). With `entangle.mode: shipped` the table of b shipped with the
base is used, after its rows are matched to the data and its validation split is recomputed
here within SHIPPED_TOLERANCE (`shipped_tokens`): the train split's ~20 k forward passes are
not repeated on every host.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from latentstrat import batching, encoding
from latentstrat.aggregations import AGGREGATIONS
from latentstrat.cells import config_alphas
from latentstrat.config import Base
from latentstrat.io import dump_json, read_parquet, write_parquet
from latentstrat.modeling.backbone import device_for, device_of
from latentstrat.modeling.objective import alpha_key, reference_scales, zfree_token_nll
from latentstrat.paths import DATA_FILES, REFERENCE_FILES, SHIPPED_REFERENCE_FILE

if TYPE_CHECKING:
    from latentstrat.jobs import Job

TOKENS_COLUMNS = ["task", "example_id", "split", "n_supervised", "b"]
# b of a shipped table against b recomputed on this host (nats per token): float rounding of
# another CPU's kernels is ~1e-6; another model or changed code is off by far more
SHIPPED_TOLERANCE = 1e-3


@torch.no_grad()
def reference_nll(model, encoded: encoding.Encoded, batch_size: int) -> list[np.ndarray]:
    """b per example (float32 arrays of length n_supervised), in row order of `encoded`."""
    model.eval()
    out: list[np.ndarray | None] = [None] * len(encoded)
    for _, batch in batching.split_batches(encoded, batch_size, device_of(model)):
        b = zfree_token_nll(model, batch).float().cpu().numpy()
        n = batch.sup_mask.sum(1).cpu().numpy()
        for r, i in enumerate(batch.row_idx.tolist()):
            out[i] = b[r, : n[r]].astype(np.float32)
    return out


def compute_scales(tokens: pd.DataFrame, alphas) -> dict:
    """n_bar from train; S_ref[agg] and T_ref[alpha][agg] from validation."""
    train, val = tokens[tokens.split == "train"], tokens[tokens.split == "validation"]
    if train.empty or val.empty:
        raise ValueError("reference scales need non-empty train and validation splits")
    n_bar = float(train.n_supervised.mean())
    b_val = list(val.b)
    S, T = {}, {alpha_key(a): {} for a in alphas}
    for agg in AGGREGATIONS:
        for a in alphas:
            s, t = reference_scales(b_val, agg, alpha=a, n_bar=n_bar)
            S[agg] = s  # S_ref does not depend on alpha
            T[alpha_key(a)][agg] = t
    return dict(
        n_bar=n_bar,
        S_ref=S,
        T_ref=T,
        alphas=[float(a) for a in alphas],
        n_validation=int(len(val)),
        n_train=int(len(train)),
    )


def load_scales(path: str | Path) -> dict:
    """The reference stage's scales table (scales.json; `path` may be the reference folder), as
    `modeling.objective.Objective.for_cell` takes it."""
    path = Path(path)
    if path.suffix != ".json":  # a reference dir
        path = path / REFERENCE_FILES["scales"]
    if not path.exists():
        raise FileNotFoundError(f"reference scales {path} does not exist (run the reference stage)")
    return json.loads(path.read_text())


def token_counts(tokens: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, split), g in tokens.groupby(["task", "split"], sort=True):
        n = g.n_supervised
        b_sum = g.b.map(lambda v: float(np.sum(v)))
        rows.append(
            dict(
                task=task,
                split=split,
                examples=int(len(g)),
                supervised_tokens_mean=float(n.mean()),
                supervised_tokens_sum=int(n.sum()),
                b_mean=float(b_sum.sum() / n.sum()),
                b_per_example_mean=float(b_sum.mean()),
            )
        )
    return pd.DataFrame(rows)


def load_b(reference_dir, df: pd.DataFrame) -> list[np.ndarray]:
    """b for each row of a split DataFrame (by task, example_id), checked against n_supervised.
    This is what the trainer passes to `batching.collate(..., b=...)`."""
    path = Path(reference_dir) / REFERENCE_FILES["tokens"]
    tokens = read_parquet(path, what="reference tokens", columns=TOKENS_COLUMNS)
    lookup = {(t, e): (n, b) for t, e, n, b in zip(tokens.task, tokens.example_id, tokens.n_supervised, tokens.b)}
    out = []
    for t, e, n in zip(df.task, df.example_id, df.n_supervised):
        if (t, e) not in lookup:
            raise ValueError(
                f"reference tokens {path} have no row for example {e!r} (task {t}): stale reference stage?"
            )
        n_ref, b = lookup[(t, e)]
        if n_ref != n or len(b) != n:
            raise ValueError(
                f"reference tokens {path}: example {e!r} has {len(b)} b values, the data says n_supervised={n}"
            )
        out.append(np.asarray(b, dtype=np.float32))
    return out


def _load_entangled_model(base: Base, data_dir: Path, entangle_dir: Path, tokenizer):
    from latentstrat.modeling.backbone import build_backbone, load_entangled

    if base.mode == "skip":
        torch.manual_seed(base.entangle["seed"])
        return build_backbone(base.backbone, tokenizer, encoding.added_token_ids(data_dir))
    model_dir = entangle_dir / "model"
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(
            f"reference: entangled model {model_dir} (config.json) does not exist (run the entangle stage)"
        )
    return load_entangled(entangle_dir)


def reference_tokens(model, entangle_cfg: dict, tokenizer, splits: dict[str, pd.DataFrame], log=print) -> pd.DataFrame:
    """TOKENS_COLUMNS for every example of `splits` under the z-free `model` (encoded and batched
    as the `entangle` section trains it); non-finite b is an error naming the split and the first
    example."""
    bs = 2 * entangle_cfg["batch_size"]
    parts = []
    for split, df in splits.items():
        b = reference_nll(model, encoding.encode(df, tokenizer, entangle_cfg["z_slots"]), bs)
        bad = [e for e, v in zip(df.example_id, b) if not np.isfinite(v).all()]
        if bad:
            raise FloatingPointError(f"reference: non-finite b for {len(bad)} {split} examples (first {bad[0]!r})")
        parts.append(
            pd.DataFrame(
                dict(
                    task=df.task,
                    example_id=df.example_id,
                    split=split,
                    n_supervised=df.n_supervised.astype("int64"),
                    b=b,
                )
            )
        )
        log(f"reference {split}: {len(df)} examples, mean b {np.concatenate(b).mean():.4f}")
    return pd.concat(parts, ignore_index=True)


def shipped_tokens(
    path: Path, model, entangle_cfg: dict, tokenizer, splits: dict[str, pd.DataFrame], log=print
) -> tuple[pd.DataFrame, float]:
    """The reference table shipped with the base (`path`, installed by the entangle stage), after
    two checks: its rows are exactly the data's examples, and b recomputed here on the whole
    validation split (the split S_ref and T_ref come from) agrees within SHIPPED_TOLERANCE.
    Returns (table, max |b here - b shipped|)."""
    tokens = read_parquet(path, what="shipped reference table", columns=TOKENS_COLUMNS)
    for split, df in splits.items():
        got = tokens[tokens.split == split]
        if (got.task.tolist(), got.example_id.tolist(), got.n_supervised.tolist()) != (
            df.task.tolist(),
            df.example_id.tolist(),
            df.n_supervised.astype("int64").tolist(),
        ):
            raise ValueError(
                f"shipped reference table {path}: its {split} rows are not the data stage's examples "
                f"(task, example_id, n_supervised); the shipped base and the data disagree"
            )
    val = splits["validation"]
    here = reference_tokens(model, entangle_cfg, tokenizer, {"validation": val}, log=lambda m: None).b
    shipped = tokens[tokens.split == "validation"].b
    diffs = [
        float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
        for a, b in zip(here, shipped)
    ]
    worst = int(np.argmax(diffs))
    if diffs[worst] > SHIPPED_TOLERANCE:
        raise ValueError(
            f"shipped reference table {path}: b recomputed here differs by {diffs[worst]:.3g} nats "
            f"(> {SHIPPED_TOLERANCE}) on validation example {val.example_id.iloc[worst]!r}: the table is "
            f"not this model's under this code; ship it again (python -m latentstrat.base.shipped --configfile ... "
            f"--reference) or compute it here with --config entangle='{{mode: train}}'"
        )
    log(f"reference: the shipped table, validation split recomputed here: max |b difference| {diffs[worst]:.2g} nats")
    return tokens, diffs[worst]


def run_reference(sections, data_dir, entangle_dir, out_dir, threads: int = 1, log=print) -> dict:
    """The reference stage (see module doc), with its config sections (`sections`: jobs.Sections,
    or a whole config: it reads every section, to expand the collection's cells). With
    `entangle.mode: shipped` the table shipped with the base (`shipped_tokens`), else b computed
    here; T_ref at the config's cells' tokcc exponents (cells.config_alphas). Returns the scales
    dict."""
    data_dir, entangle_dir, out_dir = Path(data_dir), Path(entangle_dir), Path(out_dir)
    for name in [DATA_FILES[s] for s in encoding.SPLITS] + [DATA_FILES["tokenizer"]]:
        if not (data_dir / name).exists():
            raise FileNotFoundError(f"reference: input {data_dir / name} does not exist (run the data stage)")
    torch.set_num_threads(int(threads))
    alphas, base = config_alphas(sections), Base.of(sections)
    tokenizer = encoding.load_tokenizer(data_dir)
    splits = {s: encoding.load_split(data_dir, s) for s in encoding.SPLITS}
    model = _load_entangled_model(base, data_dir, entangle_dir, tokenizer).to(device_for(sections["resources"]))
    mode, ecfg = base.mode, base.entangle
    if mode == "shipped":
        tokens, diff = shipped_tokens(entangle_dir / SHIPPED_REFERENCE_FILE, model, ecfg, tokenizer, splits, log)
        source = f"the table shipped with the base (validation recomputed here: max |b difference| {diff:.2g})"
    else:
        tokens = reference_tokens(model, ecfg, tokenizer, splits, log)
        source = "computed here"
    scales = compute_scales(tokens, alphas)
    scales["entangled_model"] = "backbone (entangle.mode skip)" if mode == "skip" else str(entangle_dir / "model")
    scales["b_source"] = source
    write_parquet(tokens, out_dir / REFERENCE_FILES["tokens"])
    write_parquet(token_counts(tokens), out_dir / REFERENCE_FILES["token_counts"])
    dump_json(scales, out_dir / REFERENCE_FILES["scales"])
    return scales


def run(job: Job) -> None:
    """The reference rule's job: the entangled model's b and the scales."""
    run_reference(
        job.config, job.folder("tokenizer"), Path(job.params["entangle_dir"]), job.folder("scales"), job.threads
    )


def main(argv=None) -> None:
    from latentstrat.config import config_for_command
    from latentstrat.paths import Paths

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.base.reference", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", required=True, help="collection config YAML")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: resources.threads)")
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    p = Paths.from_config(cfg)
    scales = run_reference(
        cfg, p.data_dir, p.entangle_dir, p.reference_dir, args.threads or cfg["resources"]["threads"]
    )
    print(json.dumps({k: scales[k] for k in ("n_bar", "S_ref", "T_ref")}, indent=2))


if __name__ == "__main__":
    main()
