"""Entangle stage: lr schedule, quality checks on hand-made samplers (latentstrat.base.quality), the
entangled model's KV-cache sampling (decode.generate_zfree), and a tiny end-to-end run
(loadable model dir, quality report, skip mode, input errors)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.base.entangle import lr_at, run_entangle, strategy_alternatives
from latentstrat.base.quality import (
    CHECKS,
    QualityError,
    quality_report,
    quality_table,
    strategy_distribution,
    total_variation,
)
from latentstrat.batching import epoch_batches
from latentstrat.config import load_config
from latentstrat.modeling import decode
from latentstrat.tasks import TASKS
from workflow_helpers import smoke_cfg

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = {"quality_min_answer_accuracy": 0.9, "quality_min_strategy_match": 0.85, "quality_max_strategy_tv": 0.15}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    data.build_dataset(smoke_cfg()["data"], d)
    return d


# ----------------------------------------------------------------------------- schedule


def test_lr_warmup_then_cosine_to_tenth():
    lr, warmup, steps = 1.0, 4, 14
    assert [lr_at(s, lr, warmup, steps) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, lr, warmup, steps) == pytest.approx(1.0)
    # halfway through the decay (step 9 of 4..14): 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert lr_at(9, lr, warmup, steps) == pytest.approx(0.55)
    assert lr_at(14, lr, warmup, steps) == pytest.approx(0.1)
    assert lr_at(0, 2.0, 0, 10) == pytest.approx(2.0)
    assert lr_at(14, lr, warmup, steps, min_ratio=0.01) == pytest.approx(0.01)  # entangle.min_lr_ratio
    assert lr_at(9, lr, warmup, steps, min_ratio=0.0) == pytest.approx(0.5)


# ----------------------------------------------------------------------------- quality checks


def test_strategy_distribution_and_tv_by_hand():
    d = strategy_distribution([{"a"}, {"a"}, {"a", "b"}, set()], ("a", "b", "c"))
    assert d == pytest.approx({"a": 2.5 / 3, "b": 0.5 / 3, "c": 0.0})  # empty set left out; ambiguous split
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 1.0}) == pytest.approx(0.5)
    assert total_variation({"a": 0.2, "b": 0.8}, {"a": 0.2, "b": 0.8}) == 0.0
    assert strategy_distribution([set()], ("a",)) == {"a": None}


def _sorting_inputs(n):
    import random

    rng, task, xs = random.Random(0), TASKS["sorting_algorithms"], []
    while len(xs) < n:
        x = task.sample_input(rng)
        ys = [task.render(x, s) for s in task.strategies]
        if len(set(ys)) == len(ys) and x not in xs:  # unambiguous inputs only
            xs.append(x)
    return xs


def _samples(xs, ys):
    return pd.DataFrame({"task": "sorting_algorithms", "x": xs, "y_generated": ys})


UNIFORM3 = {"sorting_algorithms": {"bubble": 1 / 3, "insertion": 1 / 3, "selection": 1 / 3}}


def test_perfect_sampler_passes():
    task, xs = TASKS["sorting_algorithms"], _sorting_inputs(30)
    ys = [task.render(x, task.strategies[i % 3]) for i, x in enumerate(xs)]
    r = quality_report(_samples(xs, ys), UNIFORM3, THRESHOLDS)
    t = r["tasks"]["sorting_algorithms"]
    assert r["passed"] and t["passed"] and t["n"] == 30 and t["n_matched"] == 30
    assert t["checks"]["answer_accuracy"]["value"] == 1.0
    assert t["checks"]["strategy_match_rate"]["value"] == 1.0
    assert t["checks"]["strategy_tv"]["value"] == pytest.approx(0.0)
    assert set(t["checks"]) == set(CHECKS)
    assert r["thresholds"] == THRESHOLDS


def test_one_strategy_sampler_fails_only_tv():
    task, xs = TASKS["sorting_algorithms"], _sorting_inputs(30)
    r = quality_report(_samples(xs, [task.render(x, "bubble") for x in xs]), UNIFORM3, THRESHOLDS)
    c = r["tasks"]["sorting_algorithms"]["checks"]
    assert c["answer_accuracy"]["passed"] and c["strategy_match_rate"]["passed"]
    assert c["strategy_tv"]["value"] == pytest.approx(2 / 3) and not c["strategy_tv"]["passed"]
    assert not r["passed"]


def test_malformed_and_answer_only_samplers_fail():
    task, xs = TASKS["sorting_algorithms"], _sorting_inputs(10)
    r = quality_report(_samples(xs, ["answer ; ; 9 9"] * 10), UNIFORM3, THRESHOLDS)
    c = r["tasks"]["sorting_algorithms"]["checks"]
    assert c["answer_accuracy"]["value"] == 0.0 and not c["answer_accuracy"]["passed"]
    assert c["strategy_match_rate"]["value"] == 0.0 and c["strategy_tv"]["value"] == 1.0
    # right answer, no trace: accurate but matches no strategy
    r = quality_report(_samples(xs, [f"answer {task.answer(x)}" for x in xs]), UNIFORM3, THRESHOLDS)
    c = r["tasks"]["sorting_algorithms"]["checks"]
    assert c["answer_accuracy"]["passed"] and not c["strategy_match_rate"]["passed"]
    table = quality_table(r)
    assert list(table.check) == list(CHECKS) and table.passed.tolist() == [True, False, False]


def test_threshold_boundary_and_missing_task():
    task, xs = TASKS["sorting_algorithms"], _sorting_inputs(10)
    ys = [task.render(x, task.strategies[i % 3]) if i < 9 else "junk" for i, x in enumerate(xs)]
    r = quality_report(_samples(xs, ys), UNIFORM3, {**THRESHOLDS, "quality_min_answer_accuracy": 0.9})
    assert r["tasks"]["sorting_algorithms"]["checks"]["answer_accuracy"]["value"] == pytest.approx(0.9)
    assert r["tasks"]["sorting_algorithms"]["checks"]["answer_accuracy"]["passed"]  # >= threshold passes
    with pytest.raises(ValueError, match="sorting_algorithms"):
        quality_report(_samples(xs, ys), {}, THRESHOLDS)


# ----------------------------------------------------------------------------- sampling


def _tiny_model(tokenizer):
    from latentstrat.modeling.backbone import build_backbone

    torch.manual_seed(0)
    return build_backbone(smoke_cfg()["backbone"], tokenizer).eval()


def _naive_greedy(model, prompt, eos, n):
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(t)
        if t == eos:
            break
    return ids[len(prompt) :]


def test_zfree_sampling_kv_cache_left_padding_matches_naive_loop(data_dir):
    torch.set_num_threads(1)
    tok = encoding.load_tokenizer(data_dir)
    model = _tiny_model(tok)
    df = encoding.load_split(data_dir, "test")
    enc = encoding.encode(df, tok)
    xs = df.x.tolist()[:5]
    prompts = decode.encode_prompts(tok, xs, 1).prompt
    assert prompts == [ids[: p + 4] for ids, p in zip(enc.gen_ids[:5], enc.z_open_pos)]  # the record cut after <y>
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    # temperature -> 0 makes sampling greedy: the cached, padded batch must equal per-prompt recompute
    got = decode.generate_zfree(model, tok, xs, 1, decode.Decoding(6, 5, temperature=1e-6, seed=0))
    itos = {i: w for w, i in tok.get_vocab().items()}
    eos = tok.get_vocab()["<eos>"]
    for p, text in zip(prompts, got):
        words = []
        for t in _naive_greedy(model, p, eos, 6):
            if itos[t] in ("</y>", "<eos>"):
                break
            words.append(itos[t])
        assert text == " ".join(words)
    # seeded: same seed, same samples; different seed, (almost surely) different samples
    a = decode.generate_zfree(model, tok, xs, 1, decode.Decoding(6, 2, temperature=1.0, seed=1))
    assert a == decode.generate_zfree(model, tok, xs, 1, decode.Decoding(6, 2, temperature=1.0, seed=1))
    assert a != decode.generate_zfree(model, tok, xs, 1, decode.Decoding(6, 2, temperature=1.0, seed=2))


# ----------------------------------------------------------------------------- strategy resampling


def test_strategy_alternatives_render_every_strategy_of_each_input():
    df = pd.DataFrame(
        dict(
            task=["grid_pathfinding", "sorting_algorithms", "grid_pathfinding"],
            x=["path 2 5 to 4 1", "sort 4 9 9 5", "path 3 1 to 3 5"],
        )
    )
    rows, alternatives = strategy_alternatives(df)
    assert [len(a) for a in alternatives] == [2, 3, 2]
    assert rows.loc[alternatives[0], "y"].tolist() == [
        "left 4 3 2 1 down 3 4 answer 6",
        "down 3 4 left 4 3 2 1 answer 6",
    ]
    assert rows.loc[alternatives[1], "strategy"].tolist() == list(TASKS["sorting_algorithms"].strategies)
    # an ambiguous input keeps one row per strategy (same trace twice), as the data's uniform labels do
    assert rows.loc[alternatives[2], "y"].nunique() == 1
    assert (rows.x[alternatives[1]] == "sort 4 9 9 5").all()


def test_epoch_batches_draw_one_alternative_per_input_uniformly():
    import numpy as np

    alternatives = [[0, 1], [2, 3], [4, 5, 6]]
    lengths = [5, 9, 5, 9, 7, 7, 7]
    counts = np.zeros(7)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        picked = [r for b in epoch_batches(lengths, 2, rng, alternatives) for r in b]
        assert len(picked) == 3 and sorted(r // 2 if r < 4 else 2 for r in picked) == [0, 1, 2]  # one per input
        counts[picked] += 1
    assert np.allclose(counts[:4] / 3000, 0.5, atol=0.04) and np.allclose(counts[4:] / 3000, 1 / 3, atol=0.04)
    # without alternatives: every row exactly once (the data's fixed pairs)
    assert sorted(r for b in epoch_batches(lengths, 2, rng) for r in b) == list(range(7))


# ----------------------------------------------------------------------------- stage


def test_run_entangle_writes_loadable_model_and_report(data_dir, tmp_path):
    from latentstrat.modeling.backbone import load_entangled

    cfg = smoke_cfg()
    out = tmp_path / "entangle"
    report = run_entangle(cfg, data_dir, out, threads=1, log=lambda m: None)
    assert (out / "model" / "config.json").exists() and not (out / "model.tmp").exists()
    saved = json.loads((out / "quality.json").read_text())
    assert set(saved["tasks"]) == set(cfg["data"]["tasks"])
    for t in saved["tasks"].values():
        assert set(t["checks"]) == set(CHECKS) and t["n"] == 2
        for c in t["checks"].values():
            assert {"value", "threshold", "passed"} <= set(c)
    assert saved["thresholds"]["quality_min_strategy_match"] == 0.85
    assert saved["passed"] is False and report["passed"] is False  # 3 steps of training: no strategies yet
    assert saved["training"]["steps"] == 3 and saved["training"]["tokens_per_s"] > 0
    assert saved["training"]["resample_strategies"] is True
    hist = pd.read_parquet(out / "history.parquet")
    assert list(hist.columns) == ["step", "task", "metric", "value"]
    val = hist[(hist.metric == "validation_loss") & (hist.task == "all")]
    assert val.step.min() == 0 and val.step.max() == 3
    assert (hist[hist.metric == "train_loss"].step == 3).any()
    # from_pretrained on the saved dir gives the trained model's logits exactly
    tok = encoding.load_tokenizer(data_dir)
    enc = encoding.encode(encoding.load_split(data_dir, "validation"), tok)
    batch = batching.collate(enc, range(4))
    a = load_entangled(out)
    b = load_entangled(out / "model")
    with torch.no_grad():
        la = a(input_ids=batch.gen_ids, attention_mask=batch.gen_mask).logits
        lb = b(input_ids=batch.gen_ids, attention_mask=batch.gen_mask).logits
    assert torch.equal(la, lb)
    # same seed, same run: identical history values (apart from timings)
    out2 = tmp_path / "again"
    run_entangle(cfg, data_dir, out2, threads=1, log=lambda m: None)
    h2 = pd.read_parquet(out2 / "history.parquet")
    keep = ~hist.metric.isin(["tokens_per_s", "elapsed_s"])
    pd.testing.assert_frame_equal(
        hist[keep].reset_index(drop=True), h2[~h2.metric.isin(["tokens_per_s", "elapsed_s"])].reset_index(drop=True)
    )
    with torch.no_grad():
        l2 = load_entangled(out2)(input_ids=batch.gen_ids, attention_mask=batch.gen_mask).logits
    assert torch.equal(la, l2)


def test_quality_enforce_raises_after_saving_report(data_dir, tmp_path):
    cfg = smoke_cfg(steps=1, quality_enforce=True)
    with pytest.raises(QualityError, match="strategy_match_rate"):
        run_entangle(cfg, data_dir, tmp_path, threads=1, log=lambda m: None)
    assert json.loads((tmp_path / "quality.json").read_text())["passed"] is False
    assert (tmp_path / "model" / "config.json").exists()


def test_skip_mode_records_backbone_and_writes_no_model(data_dir, tmp_path):
    cfg = load_config(
        ROOT / "config" / "smoke.yaml", overrides={"entangle": {"mode": "skip"}, "cell": {"init": "direct"}}
    )
    report = run_entangle(cfg, data_dir, tmp_path, threads=1)
    assert report["mode"] == "skip" and not (tmp_path / "model").exists()
    assert json.loads((tmp_path / "quality.json").read_text())["backbone"]["source"] == "embedded"
    assert pd.read_parquet(tmp_path / "history.parquet").empty


def test_missing_inputs_name_the_file(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="train.parquet"):
        run_entangle(smoke_cfg(), tmp_path / "nowhere", tmp_path / "out", threads=1)
    (tmp_path / "partial").mkdir()
    for s in encoding.SPLITS:
        (tmp_path / "partial" / f"{s}.parquet").write_bytes((data_dir / f"{s}.parquet").read_bytes())
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        run_entangle(smoke_cfg(), tmp_path / "partial", tmp_path / "out", threads=1)


def test_bfloat16_backbone_trains_under_autocast_and_saves_bf16(data_dir, tmp_path):
    from latentstrat.modeling.backbone import load_entangled

    cfg = load_config(
        ROOT / "config" / "smoke.yaml",
        overrides={
            "backbone": {"dtype": "bfloat16"},
            "entangle": {"steps": 2, "batch_size": 8, "warmup_steps": 0, "quality_samples_per_task": 1},
        },
    )
    report = run_entangle(cfg, data_dir, tmp_path, threads=1, log=lambda m: None)
    assert math.isfinite(report["training"]["final_validation_loss"]["all"])
    assert next(load_entangled(tmp_path).parameters()).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- fast training step


def _step_nll_and_grads(model, batch, fn, amp_dtype=torch.float32):
    from latentstrat.base.entangle_step import autocast_for

    model.zero_grad(set_to_none=True)
    with autocast_for(model, amp_dtype):
        nll = fn(model, batch)
    (nll.sum() / batch.sup_mask.sum()).backward()
    return nll.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
def test_eager_attention_compile_and_bf16_autocast_compute_the_plain_step(data_dir):
    """The entangle step's speed settings (entangle.attention, .compile, .autocast) change how
    the loss is computed, not what: eager attention and the compiled step give the plain
    step's per-token NLL and gradients (float32 rounding); bf16 autocast gives them to bf16
    precision, and is really on (the values differ)."""
    from latentstrat.modeling.objective import zfree_token_nll

    torch.set_num_threads(1)
    tok = encoding.load_tokenizer(data_dir)
    model = _tiny_model(tok).train()
    enc = encoding.encode(encoding.load_split(data_dir, "train"), tok)
    batch = batching.collate(enc, range(8))
    assert batch.sup_mask.float().mean() < 1  # padding is exercised
    ref_nll, ref_grads = _step_nll_and_grads(model, batch, zfree_token_nll)

    def close(nll, grads, atol):
        return torch.allclose(nll, ref_nll, atol=atol) and all(
            torch.allclose(g, r, atol=atol, rtol=atol) for g, r in zip(grads, ref_grads)
        )

    model.set_attn_implementation("eager")
    eager = _step_nll_and_grads(model, batch, zfree_token_nll)
    assert close(*eager, atol=1e-5)
    compiled = _step_nll_and_grads(model, batch, torch.compile(zfree_token_nll, dynamic=True))
    assert close(*compiled, atol=1e-5)
    bf16_nll, bf16_grads = _step_nll_and_grads(model, batch, zfree_token_nll, torch.bfloat16)
    assert bf16_nll.dtype == torch.float32  # the loss itself is computed in float32
    err = (bf16_nll - ref_nll).abs().max()
    assert 0 < err < 0.05 * ref_nll.abs().max()
    cos = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g in bf16_grads]), torch.cat([g.flatten() for g in ref_grads]), dim=0
    )
    assert cos > 0.99


def test_bf16_autocast_and_eager_attention_keep_a_float32_sdpa_model(data_dir, tmp_path):
    from latentstrat.modeling.backbone import load_entangled

    cfg = smoke_cfg(autocast="bfloat16", attention="eager")
    report = run_entangle(cfg, data_dir, tmp_path, threads=1, log=lambda m: None)
    tr = report["training"]
    assert tr["autocast"] == "bfloat16" and tr["attention"] == "eager" and tr["compiled"] is False
    model = load_entangled(tmp_path)
    assert next(model.parameters()).dtype == torch.float32  # weights saved in backbone.dtype
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert hf.config._attn_implementation == "sdpa"  # eager was the training step's only
    plain = run_entangle(smoke_cfg(), data_dir, tmp_path / "plain", threads=1, log=lambda m: None)["training"]
    assert plain["autocast"] == "float32" and plain["attention"] == "sdpa"


def test_compile_without_a_cxx_compiler_fails_before_training(data_dir, tmp_path, monkeypatch):
    from torch._inductor import cpp_builder

    def no_compiler():
        raise RuntimeError("no g++ on PATH")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(RuntimeError, match=r"entangle\.compile.*no g\+\+ on PATH"):
        run_entangle(smoke_cfg(compile=True), data_dir, tmp_path / "out", threads=1, log=lambda m: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_entangle_times_the_configured_step(capsys, tmp_path):
    from latentstrat.bench.__main__ import main

    def bench(config, threads):
        assert (
            main(
                [
                    "entangle",
                    "--configfile",
                    str(config),
                    "--tasks",
                    "sorting_algorithms",
                    "--examples-per-task",
                    "8",
                    "--hidden",
                    "32",
                    "--intermediate",
                    "64",
                    "--layers",
                    "1",
                    "--heads",
                    "2",
                    "--kv-heads",
                    "1",
                    "--batch-size",
                    "4",
                    "--steps",
                    "2",
                    "--warmup",
                    "1",
                    "--threads",
                    str(threads),
                    "--matmul-n",
                    "64",
                    "--json",
                ]
            )
            == 0
        )
        return json.loads(capsys.readouterr().out)

    res = bench(ROOT / "config" / "smoke.yaml", 1)
    assert res["configured"] == {
        "autocast": "none",
        "attention": "sdpa",
        "compile": False,
        "processes": 1,
    }  # smoke.yaml's
    assert res["plain"]["tokens_per_s"] > 0 and res["fast"]["tokens_per_s"] > 0
    assert res["speedup"] == pytest.approx(res["fast"]["tokens_per_s"] / res["plain"]["tokens_per_s"])
    # two data-parallel processes: the same global batches, so the same tokens per step
    (tmp_path / "dp.yaml").write_text(f"extends: {ROOT / 'config' / 'smoke.yaml'}\nentangle:\n  processes: 2\n")
    dp = bench(tmp_path / "dp.yaml", 2)
    assert dp["configured"]["processes"] == 2 and dp["fast"]["tokens_per_s"] > 0
    assert dp["fast"]["tokens_per_s"] * dp["fast"]["ms_per_step"] == pytest.approx(
        res["fast"]["tokens_per_s"] * res["fast"]["ms_per_step"]
    )


def test_ema_saves_the_hand_computed_weight_average(data_dir, tmp_path, monkeypatch):
    """entangle.ema_decay: the saved model is the moving average of the iterates,
    a_{t+1} = a_t + (1 - min(d, (1 + t) / (10 + t))) (w_{t+1} - a_t), a_0 = w_0, and the
    iterates themselves are the run without averaging's."""
    import latentstrat.base.entangle as E
    from latentstrat.modeling.backbone import load_entangled

    def run(out, ema_decay):
        iterates, orig = [], E.train_step

        def recording_step(model, *a, **k):
            if not iterates:
                iterates.append([p.detach().clone() for p in model.parameters()])
            r = orig(model, *a, **k)
            iterates.append([p.detach().clone() for p in model.parameters()])
            return r

        monkeypatch.setattr(E, "train_step", recording_step)
        report = run_entangle(smoke_cfg(steps=4, ema_decay=ema_decay), data_dir, out, threads=1, log=lambda m: None)
        return iterates, report, [p.detach() for p in load_entangled(out).parameters()]

    plain_its, _, plain_saved = run(tmp_path / "plain", None)
    ema_its, report, saved = run(tmp_path / "ema", 0.2)
    assert all(torch.equal(a, b) for x, y in zip(plain_its, ema_its) for a, b in zip(x, y))
    assert all(torch.equal(a, b) for a, b in zip(plain_saved, plain_its[-1]))  # no averaging: the last iterate
    average = [w.clone() for w in ema_its[0]]
    for t, w in enumerate(ema_its[1:]):
        weight = 1 - min(0.2, (1 + t) / (10 + t))  # 0.9, 0.818.., 0.8, 0.8
        average = [a + weight * (x - a) for a, x in zip(average, w)]
    assert all(torch.allclose(s, a, atol=1e-7) for s, a in zip(saved, average))
    assert max(float((s - w).abs().max()) for s, w in zip(saved, ema_its[-1])) > 1e-5  # not the last iterate
    hist = pd.read_parquet(tmp_path / "ema" / "history.parquet")
    ema_val = hist[hist.metric == "validation_loss_ema"].set_index("task").value
    assert set(hist[hist.metric == "validation_loss_ema"].step) == {4}
    assert report["training"]["final_validation_loss"] == pytest.approx(ema_val.to_dict())
    iterate_val = hist[(hist.metric == "validation_loss") & (hist.step == 4)].set_index("task").value
    assert report["training"]["final_validation_loss_iterate"] == pytest.approx(iterate_val.to_dict())


def test_auto_step_settings_never_pick_bf16_without_native_bf16(data_dir, monkeypatch):
    """auto on a CPU without native bf16 (the Intel Xeon case, where bf16 runs at 0.66x of
    float32) keeps float32; with native bf16 the bf16 step is timed against plain float32 and
    chosen only if it beats it by MIN_GAIN; the record names the host and the measured rates."""
    from latentstrat.base import entangle_step as E
    from latentstrat.modeling.backbone import build_backbone
    from latentstrat.runtime import host

    cfg = smoke_cfg(autocast="auto", attention="auto", compile="auto", processes="auto")
    tok = encoding.load_tokenizer(data_dir)
    train_df = encoding.load_split(data_dir, "train")
    enc = encoding.encode(train_df, tok)
    lengths = encoding.strategy_free_lengths(train_df)
    model = build_backbone(cfg["backbone"], tok)
    monkeypatch.setattr(host, "has_cxx_compiler", lambda: False)
    monkeypatch.setattr(host, "native_bf16", lambda: False)
    cpu = torch.device("cpu")
    assert E.step_candidates(cfg["entangle"], cpu) == [E.PLAIN]  # nothing to try
    records = E.Records(enc, None, lengths)
    resolved, rec = E.choose_step_settings(cfg["entangle"], model, records, cpu, 2, torch.float32, log=lambda m: None)
    assert {k: resolved[k] for k in E.PLAIN} == E.PLAIN and resolved["processes"] == 2
    assert rec["trial"] == [] and rec["host"]["native_bf16"] is not None
    monkeypatch.setattr(host, "native_bf16", lambda: True)
    resolved, rec = E.choose_step_settings(cfg["entangle"], model, records, cpu, 1, torch.float32, log=lambda m: None)
    assert [r["autocast"] for r in rec["trial"]] == ["none", "bfloat16"] and resolved["processes"] == 1
    plain, bf16 = (r["tokens_per_s"] for r in rec["trial"])
    want = "bfloat16" if bf16 >= E.MIN_GAIN * plain else "none"
    assert resolved["autocast"] == want and rec["speedup_vs_plain"] >= 1.0
    # an explicit setting is kept, not tried
    pinned = {**cfg["entangle"], "autocast": "none"}
    assert all(c["autocast"] == "none" for c in E.step_candidates(pinned, cpu))


def test_cpu_capability_names_the_vector_width_and_bf16(monkeypatch):
    """Two CPUs that both read `AMD EPYC` differ by 2.4x on the same cell: every speed number is
    named with the capability, from the flags torch reports."""
    from latentstrat.runtime import host

    def flags(*names):
        monkeypatch.setattr(host, "cpu_flags", lambda: frozenset(names))

    flags("avx2", "avx512_f", "avx512_bf16")
    assert host.cpu_capability() == "AVX-512 + native bf16"
    flags("avx2")
    assert host.cpu_capability() == "AVX2, no native bf16"
    flags("avx2", "avx512_f")
    assert host.cpu_capability() == "AVX-512, no native bf16"
    monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC")
    assert host.cpu_label() == "AMD EPYC (AVX-512, no native bf16)"
    assert host.provenance("cpu")["cpu_capability"] == "AVX-512, no native bf16"
