"""Evaluate stage: one record per test example of a trained cell (design section 5.5, docs/design.md).

    evaluate_cell(sections, cell, base, train_dir, out_path, threads)

For every test example (or the first `evaluate.test_per_task` per task, by example_id):
z is sampled from the router (seeded by `evaluate.seed`, the same noise for every cell),
y is greedy-decoded conditioned on z (decode.generate: batched, KV cache), the task's verifier
and matcher score the generation (scoring.score_generations), the posterior adapter gives
mu_q(x, y_true), and the
test-split losses of every reconstruction family and the KL are computed per example exactly
as training computes them (objective.forward_losses, z ~ q with seeded noise). The per-cell
metrics are means of these columns (tabulate.write_cell_row); the probes read router_z and
posterior_mu (probes.probe_cell).

Record columns (RECORD_COLUMNS, one parquet row per example):

| column | meaning |
|---|---|
| cell_id, task, example_id, strategy | the example and its true strategy |
| x, y_true, y_generated | input, true trace, generated trace (text before `</y>`/`<eos>`) |
| matched_strategies | list[str]: strategies whose canonical trace equals y_generated |
| followed_strategy | the one matched strategy, or null (none or several matched) |
| generation_ambiguous | y_generated matches more than one strategy |
| ambiguous | the true trace matches more than one strategy (from the data) |
| correct | the task verifier accepts y_generated's final answer |
| router_z, router_mu | list[float]: the sampled z the generation used, the router mean |
| posterior_mu | list[float]: mu_q(x, y_true) |
| n_supervised | supervised tokens of the true record (y tokens, `</y>`, `<eos>`) |
| n_generated | generated tokens up to and including `<eos>` (max_new_tokens if none) |
| reconstruction_loss ... active_reconstruction_objective | per-example A_i of each family and KL(q || router) |
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from latentstrat import batching, encoding
from latentstrat.base.reference import load_b, load_scales
from latentstrat.cells import Cell, as_cell
from latentstrat.io import write_parquet
from latentstrat.metrics import LOSS_METRIC_OF, LOSS_METRICS
from latentstrat.modeling import decode
from latentstrat.modeling.backbone import device_for, device_of
from latentstrat.modeling.model import build_model
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.modeling.scoring import score_generations
from latentstrat.paths import DATA_FILES, REFERENCE_FILES, TRAIN_FILES, BaseFolders
from latentstrat.runtime import host
from latentstrat.tasks import TASKS

if TYPE_CHECKING:
    from latentstrat.jobs import Job

HEADS = TRAIN_FILES["heads"]
RECORD_COLUMNS = [
    "cell_id",
    "task",
    "example_id",
    "strategy",
    "x",
    "y_true",
    "y_generated",
    "matched_strategies",
    "followed_strategy",
    "generation_ambiguous",
    "ambiguous",
    "correct",
    "router_z",
    "router_mu",
    "posterior_mu",
    "n_supervised",
    "n_generated",
    *LOSS_METRICS,
]


def select_test_rows(df: pd.DataFrame, per_task: int | None) -> pd.DataFrame:
    """The whole split, or the first `per_task` examples of each task by example_id."""
    if per_task is None:
        return df.reset_index(drop=True)
    parts = [g.sort_values("example_id").head(per_task) for _, g in df.groupby("task", sort=True)]
    return pd.concat(parts).reset_index(drop=True)


def load_cell_model(
    backbone_cfg: dict, lora_cfg: dict, cell: Cell | dict, tokenizer, entangle_dir, train_dir, new_token_ids=()
):
    """The cell's model (model.build_model, from the `backbone` and `lora` sections) with its
    trained adapters and heads
    (LatentStrategyModel.load_trained); a missing, unreadable or mismatched file gives an error
    naming it and the cell."""
    cell = as_cell(cell)
    model = build_model(backbone_cfg, lora_cfg, cell.work_json(), tokenizer, entangle_dir, new_token_ids)
    try:
        model.load_trained(train_dir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"evaluate: cell {cell.cell_id}: {e}") from None
    except ValueError as e:
        raise ValueError(f"evaluate: cell {cell.cell_id}: {e}") from None
    return model.eval()


@torch.no_grad()
def example_losses(
    model, encoded: encoding.Encoded, b, objective: Objective, batch_size: int, seed: int, step: int
) -> dict[str, np.ndarray]:
    """Per-example reconstruction terms, active objective and KL, and mu_q, with z ~ q (noise
    seeded per example)."""
    n = len(encoded)
    eps = torch.randn((n, model.latent_dim), generator=torch.Generator().manual_seed(seed))
    out = {k: np.zeros(n) for k in LOSS_METRIC_OF}
    out["mu_q"] = np.zeros((n, model.latent_dim), dtype=np.float32)
    for idx, batch in batching.split_batches(encoded, batch_size, device_of(model), b):
        o = forward_losses(model, batch, objective, step, eps[idx])
        for k in LOSS_METRIC_OF:
            out[k][idx] = o[k].double().cpu().numpy()
        out["mu_q"][idx] = o["mu_q"].float().cpu().numpy()
    return out


def _check_inputs(data_dir: Path, reference_dir: Path, train_dir: Path) -> None:
    for p, stage in (
        (data_dir / DATA_FILES["tokenizer"], "data"),
        (data_dir / DATA_FILES["test"], "data"),
        (reference_dir / REFERENCE_FILES["tokens"], "reference"),
        (reference_dir / REFERENCE_FILES["scales"], "reference"),
        (train_dir / HEADS, "train"),
    ):
        if not p.exists():
            raise FileNotFoundError(f"evaluate: input {p} does not exist (run the {stage} stage)")


def evaluate_cell(
    sections, cell: Cell | dict, base: BaseFolders, train_dir, out_path, threads: int | None = None
) -> pd.DataFrame:
    """Write the records.parquet (RECORD_COLUMNS) of the cell trained in `train_dir` on `base`
    (its data, entangled model and reference folders) with the evaluate stage's config sections
    (`sections`: jobs.Sections, or a whole config) and return it."""
    cell = as_cell(cell)
    data_dir, entangle_dir, reference_dir, train_dir = base.data, base.entangle, base.reference, Path(train_dir)
    if reference_dir is None:
        raise ValueError("evaluate: the base has no reference folder (its b and scales); run the reference stage")
    ecfg, resources = sections["evaluate"], sections["resources"]
    torch.set_num_threads(int(threads or resources["threads"]))
    _check_inputs(data_dir, reference_dir, train_dir)
    tokenizer = encoding.load_tokenizer(data_dir)
    test = select_test_rows(encoding.load_split(data_dir, "test"), ecfg["test_per_task"])
    unknown = sorted(set(test.task) - set(TASKS))
    if unknown:
        raise ValueError(f"evaluate: test split {data_dir / DATA_FILES['test']} has unknown tasks {unknown}")
    b = load_b(reference_dir, test)
    objective = Objective.for_cell(cell.settings, load_scales(reference_dir))
    added = encoding.added_token_ids(data_dir)
    model = load_cell_model(sections["backbone"], sections["lora"], cell, tokenizer, entangle_dir, train_dir, added)
    model = model.to(device_for(resources))

    with torch.no_grad(), model.merged():
        gen = decode.generate(
            model,
            tokenizer,
            test.x.tolist(),
            sample_z_from="router",
            decoding=decode.Decoding(ecfg["max_new_tokens"], ecfg["batch_size"], seed=ecfg["seed"]),
            progress=f"decode {cell.cell_id}",
        )
        losses = example_losses(
            model,
            encoding.encode(test, tokenizer, model.z_slots),
            b,
            objective,
            ecfg["batch_size"],
            ecfg["seed"] + 1,
            sections["train"]["steps"],
        )
    scored = score_generations(test, gen.texts)
    rec = pd.DataFrame(
        {
            "cell_id": cell.cell_id,
            "task": test.task,
            "example_id": test.example_id,
            "strategy": test.strategy,
            "x": test.x,
            "y_true": test.y,
            "y_generated": gen.texts,
            **{c: scored[c] for c in scored.columns},
            "ambiguous": test.ambiguous.astype(bool),
            "router_z": [list(map(float, r)) for r in gen.z.numpy()],
            "router_mu": [list(map(float, r)) for r in gen.mu_r.numpy()],
            "posterior_mu": [list(map(float, r)) for r in losses["mu_q"]],
            "n_supervised": test.n_supervised.astype("int64"),
            "n_generated": np.asarray(gen.n_generated, dtype="int64"),
            **{col: losses[k] for k, col in LOSS_METRIC_OF.items()},
        }
    )[RECORD_COLUMNS]
    bad = [c for c in LOSS_METRICS if not np.isfinite(rec[c]).all()]
    if bad:
        raise FloatingPointError(f"evaluate: cell {cell.cell_id}: non-finite per-example {bad[0]}")
    write_parquet(rec, out_path, provenance=host.provenance(str(device_of(model))))
    print(
        f"evaluate {cell.cell_id}: {len(rec)} examples, accuracy {rec.correct.mean():.3f}, "
        f"strategy match {rec.matched_strategies.map(len).gt(0).mean():.3f}"
    )
    return rec


def run(job: Job) -> None:
    """The evaluate rule's job: one trained cell's records on the test split."""
    evaluate_cell(
        job.config,
        job.cell,
        job.base(),
        train_dir=job.folder("summary"),
        out_path=job.output["records"],
        threads=job.threads,
    )
