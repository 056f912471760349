"""The shared step-0 validation: cells that start from the same model (the same
cells.INIT_KEYS: init, adaptation, latent_dim, z_slots and training seed; the two arms of a pair)
share its measurements at step 0 (validation.measure_model: the validation passes, probes and
decodes), taken once per init by the step0 job (`step0_validation`). Each cell's trainer checks
that its own weights, validation split and settings hash to the measurement's fingerprint
(`load_step0`: an error otherwise) and adds its own objective's losses and gradient shares; its
history is then the same as measuring in the cell, to the bit (tests/test_train.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from latentstrat import encoding
from latentstrat.cell.validation import GAUSSIANS, ValidationSettings, measure_model, prepare_validation
from latentstrat.cells import cell_training_seed, init_id
from latentstrat.io import dump_json, read_parquet, write_parquet
from latentstrat.metrics import M, history_name
from latentstrat.modeling.backbone import device_for
from latentstrat.modeling.model import build_model
from latentstrat.paths import STEP0_FILES, BaseFolders

if TYPE_CHECKING:
    from latentstrat.jobs import Job


def step0_fingerprint(model, val) -> str:
    """What a step-0 validation is a function of: every weight of the model as built (names,
    dtypes, shapes, bytes), the validation split, its noise draws and the settings that shape
    the probes and decodes."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{t.numel()}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    h.update(json.dumps(val["settings"].recorded(), sort_keys=True, default=str).encode())
    h.update(val["df"][["task", "example_id", "strategy", "x", "y"]].to_json(orient="values").encode())
    for k in ("eps", "router_eps"):
        h.update(val[k].numpy().tobytes())
    return h.hexdigest()


def save_step0(measured: dict, fingerprint: str, init: dict, val_df: pd.DataFrame, out_dir) -> None:
    """The step-0 measurements (`measure_model`) as STEP0_FILES in `out_dir`."""
    out_dir = Path(out_dir)
    p = measured["passes"]
    cols = {"task": val_df.task.tolist(), "example_id": val_df.example_id.tolist(), "l": p["l"]}
    cols.update({k: list(p[k].numpy()) for k in GAUSSIANS})
    write_parquet(pd.DataFrame(cols), out_dir / STEP0_FILES["passes"])
    # [name, value] pairs: the history keeps the order the metrics were measured in
    dump_json(
        {
            "fingerprint": fingerprint,
            "init": init,
            "metrics": list(measured["metrics"].items()),
            "per_task": {t: list(m.items()) for t, m in measured["per_task"].items()},
        },
        out_dir / STEP0_FILES["measured"],
    )


def load_step0(step0_dir, fingerprint: str, val_df: pd.DataFrame) -> dict:
    """The shared step-0 measurements in `step0_dir`, checked to be of this very model, split and
    settings (`step0_fingerprint`): a mismatch is an error naming the folder."""
    d = Path(step0_dir)
    meta = json.loads((d / STEP0_FILES["measured"]).read_text())
    if meta.get("fingerprint") != fingerprint:
        raise ValueError(
            f"step-0 validation {d} was measured on another model, validation split or settings than "
            f"this cell starts from (fingerprint {str(meta.get('fingerprint'))[:12]} != "
            f"{fingerprint[:12]}); delete the folder to measure it again"
        )
    df = read_parquet(d / STEP0_FILES["passes"], what="step-0 validation passes")
    if df.task.tolist() != val_df.task.tolist() or df.example_id.tolist() != val_df.example_id.tolist():
        raise ValueError(f"step-0 validation {d / STEP0_FILES['passes']}: its rows are not the validation split's")
    passes = {"l": [np.asarray(v, dtype=np.float32) for v in df.l]}
    passes.update({k: torch.from_numpy(np.stack(df[k].to_numpy()).astype(np.float32)) for k in GAUSSIANS})
    return {
        "passes": passes,
        "metrics": {history_name(k): v for k, v in meta["metrics"]},
        "per_task": {t: {history_name(k): v for k, v in m} for t, m in meta["per_task"].items()},
    }


def step0_validation(sections, init: dict, base: BaseFolders, out_dir, threads: int | None = None) -> str:
    """The step-0 validation, on `base` (its data and entangled model folders) with the step0
    stage's config sections (`sections`: jobs.Sections, or a whole config), that every cell
    starting from the model `init` (cells.init_settings:
    the settings that decide a cell's model as built, its training seed among them) shares:
    measured once here, read by each cell's trainer after it checks that its own model is this
    one. Returns the fingerprint."""
    resources = sections["resources"]
    torch.set_num_threads(int(threads or resources["threads"]))
    data_dir, entangle_dir = base.data, base.entangle
    tokenizer = encoding.load_tokenizer(data_dir)
    val_df = encoding.load_split(data_dir, "validation").reset_index(drop=True)
    added = encoding.added_token_ids(data_dir)
    model = build_model(sections["backbone"], sections["lora"], init, tokenizer, entangle_dir, added)
    model = model.to(device_for(resources))
    seed = cell_training_seed(init)
    settings = ValidationSettings.of(sections["train"], sections["evaluate"], sections["probes"])
    val = prepare_validation(settings, seed, tokenizer, val_df, None, int(init["latent_dim"]), int(init["z_slots"]))
    fingerprint = step0_fingerprint(model, val)
    measured = measure_model(model, tokenizer, val, seed)
    save_step0(measured, fingerprint, init, val_df, out_dir)
    print(
        f"step-0 validation of {init_id(init)}: fingerprint {fingerprint[:12]}, "
        f"posterior probe {measured['metrics'][M.posterior_probe]:.3f}, "
        f"answer accuracy {measured['metrics'][M.final_answer_accuracy]:.3f}"
    )
    return fingerprint


def run(job: Job) -> None:
    """The step0 rule's job: the step-0 validation of one model as built (its init)."""
    step0_validation(
        job.config,
        job.params["init"],
        job.base(),
        out_dir=job.folder("measured"),
        threads=job.threads,
    )
