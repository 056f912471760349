"""The training step: nothing read back to the host between logging points, the same outputs
as the library step it replaced, a non-finite loss still stopping the cell, and the counter
that measures it (runtime.dispatch) catching what it claims to."""

import numpy as np
import pytest
import torch

from base_helpers import base_folders, tiny_cfg
from latentstrat.runtime import dispatch


def test_counter_sees_syncs_and_reads():
    """Positive and negative controls of the counter: value reads, data-dependent shapes and
    boolean indexing are syncs; arithmetic, indexing by an index tensor and views are not."""
    x = torch.randn(5, 3)
    with dispatch.count() as c:
        y = (x * 2 + 1).sum(0)
        x[torch.tensor([0, 2])]
        x.view(15)
    assert c.n_syncs == 0 and c.n_ops >= 4 and "view" not in c.ops
    for read in (
        lambda: float(y[0]),
        lambda: y.sum().item(),
        lambda: bool(y.sum() > 0),
        lambda: y.tolist(),
        lambda: y.numpy(),
        lambda: (x > 0).nonzero(),
        lambda: x[x > 0],
        lambda: torch.unique(x),
    ):
        with dispatch.count() as c:
            read()
        assert c.n_syncs >= 1, read


def test_training_loop_reads_nothing_back_between_logging_points(tiny_base, tmp_path, monkeypatch):
    """The real trainer over 12 steps with reads every 5: every window of steps between two
    reads dispatches no sync and reads no tensor value (batches, noise, both passes, the
    backward, clipping, AdamW and the loop's bookkeeping); the reads come where they should."""
    from latentstrat.cell import train

    monkeypatch.setattr(train, "LOG_EVERY", 5)
    cfg, cell = tiny_cfg(steps=12, eval_every=100, checkpoint_every=100)
    windows, reads, state = [], [], {"ctx": None}
    real_read, real_call = train.read_records, train.EpochBatches.__call__

    def start(self, step):
        if state["ctx"] is None:
            state["ctx"] = dispatch.count()
            windows.append([step, state["ctx"].__enter__(), 0])
        windows[-1][2] += 1
        return real_call(self, step)

    def read(records, first_step, cell_id):
        state["ctx"].__exit__(None, None, None)
        state["ctx"] = None
        reads.append(first_step + len(records))
        return real_read(records, first_step, cell_id)

    monkeypatch.setattr(train.EpochBatches, "__call__", start)
    monkeypatch.setattr(train, "read_records", read)
    summary = train.train_cell(cfg, cell, base_folders(tiny_base), tmp_path / "c", threads=1)
    assert summary["steps"] == 12 and reads == [5, 10, 12]
    assert [n for _, _, n in windows] == [5, 5, 2]
    for first, counts, _ in windows:
        assert counts.n_syncs == 0, (first, counts.where())
        assert counts.n_ops > 100  # the steps really ran inside the window


def test_trainer_step_equals_library_step(tiny_base):
    """From the same weights over the same batches, the trainer's step (adapter switch, fast
    pass, noise on the device, fused AdamW) and the library step it replaced (peft's switch and
    forward, transformers' pass with its mask, torch's default AdamW) give the same losses to
    1e-6, gradients to 1e-4 and weight updates to 1e-3 (relative), with both layouts."""
    from latentstrat import encoding
    from latentstrat.base.reference import load_b, load_scales
    from latentstrat.bench import step
    from latentstrat.modeling.model import build_model
    from latentstrat.modeling.objective import Objective

    cfg, cell = tiny_cfg()
    folders = base_folders(tiny_base)
    tok = encoding.load_tokenizer(folders.data)
    df = encoding.load_split(folders.data, "train")
    enc = encoding.encode(df, tok, int(cell["z_slots"]))
    b = load_b(folders.reference, df)
    objective = Objective.for_cell(cell, load_scales(folders.reference))
    model = build_model(
        cfg["backbone"], cfg["lora"], cell, tok, folders.entangle, encoding.added_token_ids(folders.data)
    ).train()
    for kind in ("packed", "padded"):
        with step.layout(kind):
            eq = step.outputs_equal(model, objective, enc, b, 8, 4, 1.0, 3e-3)
        assert eq["loss_rel"] < 1e-6 and eq["grad_rel"] < 1e-4 and eq["update_rel"] < 1e-3, (kind, eq)
        assert len(set(np.round(eq["losses_trainer"], 6))) == 4  # the steps moved the weights
    # a negative control: a switch that runs the posterior adapter in both passes differs
    with torch.no_grad():
        for layer in model.switch.layers:
            layer.lora_B["generator"].weight.normal_(0, 0.05)
    real = type(model.switch).set

    def wrong_set(self, name):
        real(self, "posterior" if not self.library else name)

    try:
        type(model.switch).set = wrong_set
        eq = step.outputs_equal(model, objective, enc, b, 8, 2, 1.0, 3e-3)
    finally:
        type(model.switch).set = real
    assert eq["loss_rel"] > 1e-4


def test_step_count_names_the_norms_a_cuda_build_fuses(tiny_base):
    """`bench step` counts the fast pass's RMSNorms in a step (each trained pass: two per layer
    and the final one) and the ops this build spends on each: on a CPU build torch decomposes
    rms_norm (more than the 2 kernels a fused build runs), so the printed CUDA count is lower."""
    from latentstrat import encoding
    from latentstrat.base.reference import load_b, load_scales
    from latentstrat.bench import step
    from latentstrat.modeling.model import build_model
    from latentstrat.modeling.objective import Objective

    cfg, cell = tiny_cfg()
    folders = base_folders(tiny_base)
    tok = encoding.load_tokenizer(folders.data)
    enc = encoding.encode(encoding.load_split(folders.data, "train"), tok, int(cell["z_slots"]))
    b = load_b(folders.reference, encoding.load_split(folders.data, "train"))
    objective = Objective.for_cell(cell, load_scales(folders.reference))
    model = build_model(
        cfg["backbone"], cfg["lora"], cell, tok, folders.entangle, encoding.added_token_ids(folders.data)
    ).train()
    opt = step.train.optimizer(model.trainable_parameters(), 1e-3, 0.01)
    cpu = torch.device("cpu")
    with step.layout("padded"):
        res = step._measure(
            lambda i: step.trainer_batch(enc, b, 8, i, cpu),
            lambda batch, i: step.trainer_step(model, opt, objective, batch, i, 1.0),
            1,
            1,
            cpu,
        )
    layers = model.peft.get_base_model().config.num_hidden_layers
    assert res["norms"] == 2 * (2 * layers + 1), res
    per_norm = step.norm_ops(torch.float32, model.hidden, cpu)
    assert per_norm > 2 and res["norm_ops"] == res["norms"] * per_norm < res["ops"]
    res["graph_breaks"] = 0
    lines = step.render(
        {
            "library": res,
            "trainer": res,
            "equal": {"losses_library": [0], "loss_rel": 0, "grad_rel": 0, "update_rel": 0},
            "layout": "padded",
        }
    )
    fused = res["ops"] - res["norm_ops"] + 2 * res["norms"]
    assert any(f"{fused:,} ops" in line for line in lines), lines


def test_step_records_name_the_first_non_finite_term():
    from latentstrat.cell import train

    ok = torch.arange(len(train.RECORDED) + 1, dtype=torch.float32)
    bad = ok.clone()
    bad[train.RECORDED.index("kl")] = float("inf")
    rows = train.read_records([ok, ok + 1], 4, "c1")
    assert rows.shape == (2, len(train.RECORDED) + 1) and np.array_equal(rows[1], ok.numpy() + 1)
    assert rows[0, train.RECORDED.index("total")] == train.RECORDED.index("total") and rows[0, -1] == len(
        train.RECORDED
    )
    with pytest.raises(train.NonFiniteLoss, match=r"cell c1: step 6: loss term kl_prior_loss"):
        train.read_records([ok, bad, ok], 4, "c1")


def test_cell_optimizer_trains_bf16_weights_through_float32_masters():
    """A bf16 weight under CellOptimizer: AdamW on its float32 master (steps smaller than bf16's
    resolution accumulate), the weight the master's rounding; its state resumes the masters
    exactly, and a plain AdamW state of the same weights (an older checkpoint) loads."""
    from latentstrat.modeling.optim import CellOptimizer

    def make():
        w16 = torch.nn.Parameter(torch.full((4,), 1.0, dtype=torch.bfloat16))
        w32 = torch.nn.Parameter(torch.zeros(3))
        return w16, w32, CellOptimizer([w16, w32], lr=1e-4, weight_decay=0.0)

    w16, w32, opt = make()
    for _ in range(30):  # each update ~1e-4, below bf16's spacing at 1.0 (2^-7)
        opt.zero_grad()
        (w16.float().sum() + w32.sum()).backward()
        opt.gather()
        opt.step()
    assert torch.allclose(opt.masters[0], torch.full((4,), 1 - 30e-4), atol=2e-5)  # the master moved
    assert torch.equal(w16, opt.masters[0].to(torch.bfloat16)) and torch.allclose(w32, torch.full((3,), -30e-4))
    a16, a32, again = make()
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.masters[0], opt.masters[0]) and torch.equal(a16, w16)
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(3))], lr=1e-4)
    for p in plain.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    plain.step()
    b16, b32, old = make()
    old.load_state_dict(plain.state_dict())
    assert old.adamw.state[old.params[0]]["exp_avg"].shape == (3,)  # the float32 weight's moments
    assert old.adamw.state[old.params[1]]["exp_avg"].shape == (4,)  # the master's


@pytest.mark.slow
def test_compiled_layers_train_the_same_cell(tiny_base, tmp_path, monkeypatch):
    """`train.compile` on the padded layout (the GPU path, here on the CPU): the cell's history
    equals the eager padded run's to float rounding (compiled kernels reorder sums)."""
    import pandas as pd
    import torch._dynamo

    from latentstrat.cell import train
    from latentstrat.modeling import backbone

    monkeypatch.setattr(backbone, "LAYOUT", "padded")
    torch._dynamo.utils.counters.clear()
    runs = {}
    for compiled in (False, True):
        cfg, cell = tiny_cfg(steps=4, eval_every=2, checkpoint_every=100, compile=compiled)
        train.train_cell(cfg, cell, base_folders(tiny_base), tmp_path / str(compiled), threads=1)
        runs[compiled] = pd.read_parquet(tmp_path / str(compiled) / "history.parquet")
    monkeypatch.setattr(backbone, "COMPILE", False)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # both adapters' layers compiled
    eager, comp = runs[False], runs[True]
    assert list(eager.metric) == list(comp.metric) and len(eager) > 20
    losses = eager.metric.str.endswith("_loss") & eager.step.gt(0)
    assert np.allclose(comp.value[losses], eager.value[losses], rtol=1e-4, atol=1e-6)
