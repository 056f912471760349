"""Structural tests of the latent strategy model on a tiny Qwen2."""

import numpy as np
import pandas as pd
import pytest
import torch
from peft.tuners.lora import LoraLayer

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.modeling.backbone import build_backbone, load_entangled
from latentstrat.modeling.model import HEAD_PREFIXES, LatentStrategyModel
from latentstrat.modeling.objective import Objective

EMB = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
}
BB = {"source": "embedded", "dtype": "float32", "embedded": EMB}


@pytest.fixture(scope="module")
def tok():
    texts = [encoding.render_record("3 1 2", "a b c 1 2 3"), encoding.render_record("5 4", "d e 4 5")]
    tk = data.build_tokenizer(texts)
    return encoding.record_tokenizer(tk)


def batch(tok, ys, xs=None, P=1):
    xs = xs or ["3 1 2"] * len(ys)
    df = pd.DataFrame({"task": "t", "x": xs, "y": ys})
    enc = encoding.encode(df, tok, P)
    return batching.collate(enc, range(len(ys)))


ROWS = [("a b c 1 2 3", "3 1 2"), ("d e 4 5", "5 4"), ("c b a 1 2 3", "3 1 2")]


def three_rows(tok):
    """Three (y, x) rows of different lengths and their batch, with a random b."""
    b = batch(tok, [y for y, _ in ROWS], xs=[x for _, x in ROWS])
    b.b = torch.rand(b.sup_ids.shape)
    return ROWS, b


def objective_of(**over) -> Objective:
    """J of a cell with raw, sum, beta 0.1 unless overridden, and fixed scales."""
    cell = {
        "reconstruction_family": "raw",
        "token_aggregation": "sum",
        "beta": 0.1,
        "beta_schedule": "constant",
        "posterior_variance_weight": 0.0,
        "router_marginal_kl_weight": 0.0,
        **over,
    }
    return Objective.with_scales(cell, {"S_ref": 2.0, "T_ref": 1.5, "n_bar": 5.0})


def model(tok, adaptation="lora", P=1, seed=0):
    torch.manual_seed(seed)
    return LatentStrategyModel(build_backbone(BB, tok), 4, P, adaptation, {"r": 4})


def test_backbone_is_tied_qwen2_with_tokenizer_ids(tok):
    bb = build_backbone(BB, tok)
    assert bb.config.model_type == "qwen2" and bb.config.tie_word_embeddings
    assert bb.config.vocab_size == len(tok)
    assert bb.lm_head.weight.data_ptr() == bb.get_input_embeddings().weight.data_ptr()
    assert bb.config.pad_token_id == tok.convert_tokens_to_ids("<pad>")
    assert bb.config.eos_token_id == tok.convert_tokens_to_ids("<eos>")
    with pytest.raises(ValueError, match="num_attention_heads"):
        build_backbone({**BB, "embedded": {**EMB, "num_attention_heads": 3}}, tok)


def test_router_ignores_y_posterior_does_not(tok):
    m = model(tok).eval()
    b1, b2 = batch(tok, ["a b c 1 2 3"]), batch(tok, ["c b a 1 2 3"])
    z = torch.randn(1, 4)
    with torch.no_grad():
        _, mu1, lv1 = m.generator(b1.gen_ids, b1.gen_mask, z, b1.z_open_pos, b1.z_slot_pos)
        _, mu2, lv2 = m.generator(b2.gen_ids, b2.gen_mask, z, b2.z_open_pos, b2.z_slot_pos)
        assert torch.equal(mu1, mu2) and torch.equal(lv1, lv2)
        # router_prefix gives the same router as the full pass
        mu3, _ = m.router_prefix(b1.gen_ids, b1.gen_mask, b1.z_open_pos)
        assert torch.allclose(mu1, mu3, atol=1e-6)
        q1, q2 = m.posterior(b1.post_ids, b1.post_mask), m.posterior(b2.post_ids, b2.post_mask)
        assert not torch.allclose(q1[0], q2[0])
        # the router does depend on x (positive control)
        b3 = batch(tok, ["a b c 1 2 3"], xs=["5 4"])
        assert not torch.allclose(m.router_prefix(b3.gen_ids, b3.gen_mask, b3.z_open_pos)[0], mu1)


def test_padding_does_not_change_outputs(tok):
    m = model(tok).eval()
    single = batch(tok, ["d e 4 5"], xs=["5 4"])
    padded = batch(tok, ["d e 4 5", "a b c 1 2 3 a b c"], xs=["5 4", "3 1 2"])
    z = torch.randn(2, 4)
    with torch.no_grad():
        l1, mu1, _ = m.generator(
            single.gen_ids, single.gen_mask, z[:1], single.z_open_pos, single.z_slot_pos, sup_pos=single.gen_sup_pos
        )
        l2, mu2, _ = m.generator(
            padded.gen_ids, padded.gen_mask, z, padded.z_open_pos, padded.z_slot_pos, sup_pos=padded.gen_sup_pos
        )
        n = single.sup_mask.sum()
        assert torch.allclose(l1[0, :n], l2[0, :n], atol=1e-5) and torch.allclose(mu1[0], mu2[0], atol=1e-5)
        q1 = m.posterior(single.post_ids, single.post_mask)[0]
        q2 = m.posterior(padded.post_ids, padded.post_mask)[0]
        assert torch.allclose(q1[0], q2[0], atol=1e-5)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_fast_pass_equals_the_library_pass(tok, monkeypatch, layout):
    """A task-mixed batch (short and long rows) through the fast pass (packed: no work on the
    pads; padded: no attention mask) with the adapter switch gives the losses, heads and
    gradients of transformers' padded pass under peft's own adapter switching and forward, to
    float rounding, with grouped-query attention (2 heads, 1 key/value head) and adapters that
    have moved from their init."""
    from latentstrat.modeling import backbone as bb
    from latentstrat.modeling.objective import forward_losses

    short, long_ = ("d e 4 5", "5 4"), ("a b c 1 2 3 a b c 1 2 3 a b c 1 2 3", "3 1 2 3 1 2")
    rows = [short if k % 3 else long_ for k in range(24)]
    b = batch(tok, [y for y, _ in rows], xs=[x for _, x in rows])
    b.b = torch.rand(b.sup_ids.shape)
    assert b.gen_ids.numel() > 1.5 * int(b.gen_mask.sum())  # mostly padding
    objective = objective_of(reconstruction_family="dist_tokcc_0.05_0.95")
    eps = torch.randn(len(rows), 4)

    def run(kind):
        monkeypatch.setattr(bb, "LAYOUT", kind)
        m = model(tok)
        m.switch.library = kind == "transformers"
        _move_from_init(m)
        calls = []
        inner = m.lm.model.forward
        m.lm.model.forward = lambda *a, **k: calls.append(k["attention_mask"].shape) or inner(*a, **k)
        out = forward_losses(m, b, objective, 3, eps)
        out["total"].backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        return out, grads, calls

    ref, ref_grads, ref_calls = run("transformers")
    got, grads, calls = run(layout)
    assert len(ref_calls) == 2 and calls == []  # transformers' pass twice; the fast pass instead
    for k in ("raw", "tokcc", "kl", "mu_q", "mu_r", "logvar_r"):
        assert torch.allclose(got[k], ref[k], atol=1e-5, rtol=1e-5), k
        assert not torch.equal(ref[k], torch.zeros_like(ref[k])), k
    assert set(grads) == set(ref_grads) and any(".lora_B.posterior" in n for n in grads)
    for n in grads:
        assert torch.allclose(grads[n], ref_grads[n], atol=1e-5, rtol=1e-4), n


def test_fast_pass_only_where_exact(tok):
    """Sliding-window attention, attention dropout in training or activation checkpointing:
    transformers' pass. A left-padded batch is not what the fast pass computes (a negative
    control), and it reads exactly the positions asked for."""
    from latentstrat.modeling.backbone import Layout, fast_hidden, fast_pass_ok, hidden_at

    m = model(tok).eval()
    assert fast_pass_ok(m.lm)
    bb = build_backbone(BB, tok)
    bb.config.use_sliding_window = True
    assert not fast_pass_ok(bb)
    bb.config.use_sliding_window, bb.config.attention_dropout = False, 0.1
    assert fast_pass_ok(bb.eval()) and not fast_pass_ok(bb.train())
    ids = torch.randint(4, len(tok), (2, 4))
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with torch.no_grad():
        want = m.lm.model(input_ids=ids, attention_mask=left).last_hidden_state
        wrong = fast_hidden(m.lm, Layout.build("padded", [4, 4], 4, None, "cpu"), input_ids=ids)
        assert torch.allclose(want[1], wrong[1], atol=1e-5) and not torch.allclose(want[0, 1:], wrong[0, 1:], atol=1e-3)
        want = m.lm.model(input_ids=ids, attention_mask=right).last_hidden_state
        read = (np.array([1, 0, 1]), np.array([3, 2, 1]))
        for kind in ("packed", "padded"):
            got = fast_hidden(m.lm, Layout.build(kind, [3, 4], 4, read, "cpu"), input_ids=ids)
            assert got.shape == (3, EMB["hidden_size"])
            assert torch.allclose(got, want[torch.as_tensor(read[0]), torch.as_tensor(read[1])], atol=1e-5), kind
        full = hidden_at(m.lm, right, np.array([3, 4]), None, input_ids=ids)  # every position
        assert torch.allclose(full[right.bool()], want[right.bool()], atol=1e-5)


def test_adapter_switch_equals_peft_switch(tok):
    """The switch's flag and its LoRA forward (one matmul and one accumulating matmul) give
    what peft's set_adapter and forward give, per adapter, forward and gradients; peft's
    forward runs for a layer with dropout on its adapter; switching touches no requires_grad."""
    m = model(tok)
    _move_from_init(m)
    layer = m.lm.model.layers[0].mlp.up_proj
    x = torch.randn(2, 7, layer.in_features, requires_grad=True)

    def run(library, name):
        m.switch.library = library
        m.switch.set(name)
        for p in (x, *m.parameters()):
            p.grad = None
        y = layer(x)
        (y * torch.arange(y.numel()).view_as(y)).sum().backward()
        return y, x.grad.clone(), layer.lora_A[name].weight.grad.clone(), layer.lora_B[name].weight.grad.clone()

    assert layer.scaling["generator"] != 1.0
    outs = {}
    for name in ("generator", "posterior"):
        for got, want in zip(run(False, name), run(True, name)):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5) and got.abs().sum() > 0
        outs[name] = run(False, name)[0]
    assert not torch.allclose(outs["generator"], outs["posterior"], atol=1e-3)  # the flag switches
    m.switch.library = False
    with torch.no_grad():  # a control: drop the LoRA term and the outputs differ
        assert not torch.allclose(layer(x), layer.base_layer(x), atol=1e-3)
    flags = [p.requires_grad for p in m.parameters()]
    with m.adapter("posterior"):
        assert [p.requires_grad for p in m.parameters()] == flags
    layer.lora_dropout["generator"] = torch.nn.Dropout(0.5)
    m.switch.set("generator")
    with torch.no_grad():
        torch.manual_seed(0)
        a = layer(x)
        m.switch.library = True
        torch.manual_seed(0)
        assert torch.equal(a, layer(x))


def test_length_groups_cover_every_token_once():
    """Packed attention runs per group of rows of similar length; the groups hold every real
    token once, at its own row's positions, and `order` puts them back in the packed order."""
    from latentstrat.modeling.backbone import Layout

    lengths = np.array([5, 1, 9, 3, 9, 2, 7])
    same = Layout.build("packed", [3] * 7, 3, None, "cpu", n_groups=3)  # similar lengths: one group
    assert same.order is None and len(same.groups) == 1 and same.groups[0][2:] == (7, 3)
    lay = Layout.build("packed", lengths, 10, None, "cpu", n_groups=3)
    assert [w for *_, w in lay.groups] == [3, 7, 9] and sum(r for _, _, r, _ in lay.groups) == 7
    sel = torch.cat([s for s, *_ in lay.groups])
    assert sorted(sel.tolist()) == list(range(lengths.sum()))
    assert torch.equal(sel[lay.order], torch.arange(lengths.sum()))
    for s_, dst, _rows, width in lay.groups:  # a token at position t of its row sits at column t
        assert torch.equal(lay.positions[s_], dst % width)


@pytest.mark.parametrize("P", [1, 2])
def test_z_changes_generator_logits_once_its_projection_is_trained(tok, P):
    m = model(tok, P=P).eval()
    b = batch(tok, ["a b c 1 2 3"], P=P)

    def logits(z):
        with torch.no_grad():
            return m.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos)

    slot = int(b.z_slot_pos[0, 0])
    # at initialization the z projection is zero: z changes nothing (the initialization invariant)
    (l1, mu1, _), (l2, mu2, _) = logits(torch.zeros(1, 4)), logits(torch.ones(1, 4))
    assert torch.equal(l1, l2) and torch.equal(mu1, mu2)
    # with a non-zero projection (as after training) z moves everything after the slot, nothing before
    torch.nn.init.normal_(m.z_proj.weight, std=0.02)
    (l1, mu1, _), (l2, mu2, _) = logits(torch.zeros(1, 4)), logits(torch.ones(1, 4))
    assert torch.equal(l1[:, :slot], l2[:, :slot])  # causal: nothing before the slot moves
    assert not torch.allclose(l1[:, slot:], l2[:, slot:])
    assert torch.equal(mu1, mu2)


def _grads(m, tok):
    b = batch(tok, ["a b c 1 2 3", "d e 4 5"], xs=["3 1 2", "5 4"])
    mu_q, lv_q = m.posterior(b.post_ids, b.post_mask)
    z = mu_q + lv_q.mul(0.5).exp() * torch.randn_like(mu_q)
    logits, mu_r, lv_r = m.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos, sup_pos=b.gen_sup_pos)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.sup_ids) + mu_r.pow(2).sum() + lv_r.sum()
    loss.backward()
    return {n for n, p in m.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}


def _move_from_init(m):
    """LoRA B and the z projection start at 0; move them (as training does) so everything
    behind them gets gradients too."""
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n or n == "z_proj.weight":
                p.normal_(0, 0.02)


def test_at_init_z_projection_learns_and_posterior_waits_for_it(tok):
    """z_proj = 0: reconstruction sends no gradient into the posterior yet, but the projection
    itself gets one (its gradient is the slot's gradient times z), so z starts to matter."""
    got = _grads(model(tok), tok)
    assert "z_proj.weight" in got
    assert not any("lora_A.posterior" in n or "lora_B.posterior" in n for n in got)


def test_lora_only_adapters_and_heads_get_gradients(tok):
    m = model(tok)
    _move_from_init(m)
    got = _grads(m, tok)
    assert got, "no gradients at all"
    assert all(".lora_" in n or n.startswith(("router_head", "posterior_head", "z_proj")) for n in got), got
    # both adapters, both heads and the z projection learn from one backward
    assert any("lora_A.generator" in n for n in got) and any("lora_A.posterior" in n for n in got)
    assert {"router_head.proj.weight", "posterior_head.proj.weight", "z_proj.weight"} <= got
    base = [
        p
        for n, p in m.named_parameters()
        if ".lora_" not in n and not n.startswith(("router_head", "posterior_head", "z_proj"))
    ]
    assert base and all(not p.requires_grad for p in base)
    # the saved trainable state is adapters + heads only
    assert set(m.trainable_state_dict()) == {n for n, p in m.named_parameters() if p.requires_grad}


def test_frozen_and_full(tok):
    got = _grads(model(tok, "frozen"), tok)
    assert got and all(n.startswith(("router_head", "posterior_head", "z_proj")) for n in got)
    m = model(tok, "full")
    _move_from_init(m)
    got = _grads(m, tok)
    assert any(n.startswith("lm.model.layers") for n in got) and any(n.startswith("lm_post.model.layers") for n in got)


def _perturbed(tok, adaptation="lora"):
    m1, m2 = model(tok, adaptation, seed=0), model(tok, adaptation, seed=0)
    with torch.no_grad():
        for p in m1.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m1.eval(), m2.eval()


@pytest.mark.parametrize("adaptation", ["lora", "full", "frozen"])
def test_trained_cell_roundtrip(tok, tmp_path, adaptation):
    """save_trained / load_trained: peft adapter folders (lora) or backbone copies (full), and
    the heads; the loaded model computes what the saved one did, a fresh one does not."""
    m1, m2 = _perturbed(tok, adaptation)
    m1.save_trained(tmp_path)
    assert (tmp_path / "heads" / "heads.safetensors").exists() and (tmp_path / "heads" / "config.json").exists()
    if adaptation == "lora":
        assert sorted(p.name for p in (tmp_path / "adapters").iterdir() if p.is_dir()) == ["generator", "posterior"]
    b = batch(tok, ["a b c 1 2 3"])
    z = torch.randn(1, 4)
    with torch.no_grad():
        out1 = m1.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos)[0]
        q1 = m1.posterior(b.post_ids, b.post_mask)[0]
        assert not torch.allclose(out1, m2.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos)[0])
        m2.load_trained(tmp_path)
        assert torch.equal(out1, m2.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos)[0])
        assert torch.equal(q1, m2.posterior(b.post_ids, b.post_mask)[0])
    other = "frozen" if adaptation != "frozen" else "lora"
    with pytest.raises(ValueError, match="does not fit this cell"):
        model(tok, other).load_trained(tmp_path)


def test_trained_cell_errors_name_the_file(tok, tmp_path):
    m1, _ = _perturbed(tok)
    m1.save_trained(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing" / "heads" / "config.json")):
        model(tok).load_trained(tmp_path / "nothing")
    w = tmp_path / "adapters" / "posterior" / "adapter_model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"{w} is unreadable"):
        model(tok).load_trained(tmp_path)
    m1.save_trained(tmp_path)
    with pytest.raises(ValueError, match="other LoRA settings.*'r': \\(4, 2\\)"):
        torch.manual_seed(0)
        LatentStrategyModel(build_backbone(BB, tok), 4, 1, "lora", {"r": 2}).load_trained(tmp_path)


def test_checkpoint_state_roundtrip(tok):
    """A checkpoint's trainable state dict (adapters + heads under the model's names) loads into
    the same parameters; a state of another adaptation is refused."""
    m1, m2 = _perturbed(tok)
    state = m1.trainable_state_dict()
    assert any(".lora_A.posterior." in n for n in state) and "z_proj.weight" in state
    m2.load_trainable(state)
    assert all(torch.equal(t, m2.trainable_state_dict()[n]) for n, t in state.items())
    with pytest.raises(ValueError, match="does not match"):
        model(tok, "frozen").load_trainable(state)


def test_save_pretrained_loads_through_from_pretrained(tok, tmp_path):
    torch.manual_seed(1)
    bb = build_backbone(BB, tok).eval()
    bb.save_pretrained(tmp_path / "ckpt")
    b = batch(tok, ["a b c 1 2 3"])
    loaded_p = build_backbone(
        {"source": "pretrained", "name_or_path": str(tmp_path / "ckpt"), "dtype": "float32"}, tok
    ).eval()
    loaded_e = load_entangled(tmp_path / "ckpt").eval()
    with torch.no_grad():
        ref = bb(input_ids=b.gen_ids).logits
        assert torch.equal(ref, loaded_p(input_ids=b.gen_ids).logits)
        assert torch.equal(ref, loaded_e(input_ids=b.gen_ids).logits)
    # config_json: same architecture, random weights
    cj = build_backbone(
        {"source": "config_json", "name_or_path": str(tmp_path / "ckpt" / "config.json"), "dtype": "float32"}, tok
    )
    assert cj.config.hidden_size == 32 and sum(p.numel() for p in cj.parameters()) == sum(
        p.numel() for p in bb.parameters()
    )
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_entangled(tmp_path / "nothing")


def test_merged_passes_equal_the_lora_passes(tok):
    """model.merged(): plain backbone copies with each adapter folded in. At initialization
    (LoRA B = 0) the same outputs to the bit; once the adapters moved, the same outputs to float
    rounding, and different from the initialization's (the adapters really are folded in). The
    LoRA model itself is untouched and trains on afterwards."""
    from latentstrat.modeling.objective import forward_losses

    rows, b = three_rows(tok)
    objective = objective_of()
    eps = torch.randn(len(rows), 4)
    keys = ("raw", "kl", "mu_q", "mu_r", "logvar_r")
    m = model(tok).eval()

    def run():
        with torch.no_grad():
            out = forward_losses(m, b, objective, 0, eps)
        return {k: out[k].clone() for k in keys}

    at_init = run()
    with torch.no_grad(), m.merged():
        merged_init = run()
        assert all(not isinstance(x, LoraLayer) for x in m.lm.modules()) and m.lm_post is not m.lm
    for k in keys:
        assert torch.equal(merged_init[k], at_init[k]), k
    _move_from_init(m)
    base_weights = {n: p.clone() for n, p in m.named_parameters() if "base_layer" in n}
    moved = run()
    with torch.no_grad(), m.merged():
        merged = run()
    for k in keys:
        assert torch.allclose(merged[k], moved[k], atol=1e-5, rtol=1e-5), k
    # the heads did not move: mu_q and mu_r moved through the posterior and generator adapters alone
    assert not torch.allclose(moved["mu_q"], at_init["mu_q"]) and not torch.allclose(moved["mu_r"], at_init["mu_r"])
    # afterwards: the LoRA model as it was, trainable
    assert any(isinstance(x, LoraLayer) for x in m.lm.modules()) and m.lm_post is m.lm
    assert all(torch.equal(p, base_weights[n]) for n, p in m.named_parameters() if "base_layer" in n)
    assert all(p.requires_grad for p in m.trainable_parameters())
    assert {"lora_A", "lora_B"} <= {part for n in _grads(m, tok) for part in n.split(".")}
    with pytest.raises(RuntimeError, match="no-grad"), m.merged():
        pass


def test_merged_is_a_no_op_for_full_and_frozen(tok):
    for adaptation in ("full", "frozen"):
        m = model(tok, adaptation=adaptation)
        lm, lm_post = m.lm, m.lm_post
        with m.merged():  # no copies, whatever the grad mode
            assert m.lm is lm and m.lm_post is lm_post


def test_gradient_checkpointing_gives_the_same_gradients(tok, monkeypatch):
    """train.gradient_checkpointing recomputes transformers' layers in the backward pass: the
    same losses and gradients as without (on transformers' padded pass, which it applies to)."""
    from latentstrat.modeling import backbone as bb
    from latentstrat.modeling.objective import forward_losses

    monkeypatch.setattr(bb, "LAYOUT", "transformers")
    b = batch(tok, ["a b c 1 2 3", "d e 4 5"], xs=["3 1 2", "5 4"])
    b.b = torch.rand(b.sup_ids.shape)
    objective = objective_of()
    eps = torch.randn(2, 4)

    def grads(checkpointing):
        m = model(tok)
        _move_from_init(m)
        if checkpointing:
            m.gradient_checkpointing_enable()
        m.train()
        calls = []
        m.lm.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        out = forward_losses(m, b, objective, 1, eps)
        out["total"].backward()
        return out["total"].detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}, len(calls)

    (l0, g0, n0), (l1, g1, n1) = grads(False), grads(True)
    assert n1 > n0  # the layers really ran again in the backward pass
    assert torch.equal(l0, l1) and set(g0) == set(g1) and any(".lora_B.posterior" in n for n in g1)
    bad = {n: float((g0[n] - g1[n]).abs().max()) for n in g0 if not torch.allclose(g0[n], g1[n], atol=1e-6)}
    assert not bad, bad


def test_bf16_backbone_step_and_decoding_agree_with_float32(tok, tmp_path):
    """A bf16 backbone on CPU (adapters and heads stay float32): the cell's training step runs
    and its losses agree with the float32 model's within 2% (bf16 keeps 8 bits of mantissa);
    greedy decoding runs and its first-step logits agree within 0.05."""
    from latentstrat.modeling import decode
    from latentstrat.modeling.objective import forward_losses

    torch.manual_seed(3)
    bb = build_backbone(BB, tok)
    with torch.no_grad():  # a backbone whose outputs are not all near zero
        for p in bb.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else None
    bb.save_pretrained(tmp_path / "m")
    rows, b = three_rows(tok)
    objective = objective_of(token_aggregation="mean")
    eps = torch.randn(len(rows), 4)
    out = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        m = LatentStrategyModel(load_entangled(tmp_path / "m", dtype=dtype), 4, 1, "lora", {"r": 4})
        _move_from_init(m)
        assert next(m.lm.parameters()).dtype == getattr(torch, dtype)
        for n, p in m.named_parameters():  # adapters in the backbone's dtype, heads in float32
            assert p.dtype == (getattr(torch, dtype) if ".lora_" in n else p.dtype), n
        assert all(p.dtype == torch.float32 for n, p in m.named_parameters() if n.startswith(HEAD_PREFIXES))
        losses = forward_losses(m, b, objective, 1, eps)
        losses["total"].backward()
        assert all(torch.isfinite(p.grad).all() for p in m.trainable_parameters() if p.grad is not None)
        m.eval()
        with torch.no_grad(), m.adapter("generator"):
            p = decode.encode_prompts(tok, [x for _, x in rows], 1)
            ids, mask = decode._pad(p.prompt, tok.pad_token_id, left=True)
            slots = torch.tensor(p.slot_pos) + (ids.shape[1] - mask.sum(1))[:, None]
            first = (
                m.lm(
                    inputs_embeds=m.embed_with_z(ids, eps, slots),
                    attention_mask=mask,
                    position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                )
                .logits[:, -1]
                .float()
            )
            gen = decode.generate(m, tok, [x for _, x in rows], z=eps, decoding=decode.Decoding(max_new_tokens=6))
        out[dtype] = (losses["raw"].detach(), first, gen)
    (l32, f32, _), (l16, f16, g16) = out["float32"], out["bfloat16"]
    assert (l16 - l32).abs().max() <= 0.02 * l32.abs().max()
    assert (f16 - f32).abs().max() < 0.05 and f32.std() > 0.1
    assert all(len(t) > 0 for t in g16.token_ids)
