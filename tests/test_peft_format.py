"""A trained cell opens with transformers + peft alone: its generator adapter (with the z
projection written into the slot) and its posterior adapter (with the posterior head) compute
the cell's generator logits and mu_q on right- and left-padded batches, and docs/open-a-cell.md's
snippet generates what the project's own decoding generates."""

import json
import re
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from base_helpers import TINY, base_folders
from latentstrat import batching, encoding
from latentstrat.cells import expand_cells
from latentstrat.config import load_config
from latentstrat.modeling import decode

ROOT = Path(__file__).resolve().parents[1]
ROWS = [("3 1 2", None), ("5 4 9 8 7 6 1", None), ("2", None)]


@pytest.fixture(scope="module")
def cell(tiny_base, tmp_path_factory):
    """A cell freshly trained by the train stage on the tiny base, and the project's model of it."""
    from latentstrat.cell.evaluate import load_cell_model
    from latentstrat.cell.train import train_cell

    cfg = load_config(cfg=json.loads(json.dumps(TINY)))
    c = expand_cells(cfg)[0].to_json()
    out = tmp_path_factory.mktemp("cell") / "train"
    train_cell(cfg, c, base_folders(tiny_base), out, threads=1)
    tok = encoding.load_tokenizer(tiny_base["data_dir"])
    model = load_cell_model(cfg["backbone"], cfg["lora"], c, tok, tiny_base["entangle_dir"], out).eval()
    df = encoding.load_split(tiny_base["data_dir"], "test").groupby("task").head(3).reset_index(drop=True)
    return {"train": out, "base": tiny_base["entangle_dir"] / "model", "tok": tok, "model": model, "df": df}


def left_pad(ids, mask, pad):
    """The same rows left-padded, with position ids that count real tokens only."""
    out_ids, out_mask = torch.full_like(ids, pad), torch.zeros_like(mask)
    shift = mask.shape[1] - mask.sum(1)
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        out_ids[r, int(shift[r]) :], out_mask[r, int(shift[r]) :] = ids[r, :n], 1
    return out_ids, out_mask, shift, (out_mask.cumsum(1) - 1).clamp(min=0)


def realign(t, shift):
    """Rows of a left-padded [B, T, ...] tensor moved back to the right-padded layout."""
    return torch.stack([torch.roll(t[r], -int(shift[r]), dims=0) for r in range(t.shape[0])])


def test_generator_adapter_reproduces_the_cells_logits(cell):
    m, tok = cell["model"], cell["tok"]
    enc = encoding.encode(cell["df"], tok, m.z_slots)
    b = batching.collate(enc, range(len(enc)))
    assert b.gen_mask.sum(1).unique().numel() > 1  # rows of different lengths: real padding
    z = torch.randn(len(enc), m.latent_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = m.generator(b.gen_ids, b.gen_mask, z, b.z_open_pos, b.z_slot_pos)[0]
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(cell["base"]), cell["train"] / "adapters" / "generator"
    ).eval()
    heads = load_file(cell["train"] / "heads" / "heads.safetensors")
    assert heads["z_proj.weight"].abs().max() > 0  # training moved the z projection off zero

    def logits(ids, mask, slots, pos=None):
        with torch.no_grad():
            emb = peft.get_input_embeddings()(ids)
            rows = torch.arange(len(ids))[:, None]
            emb[rows, slots] += (z @ heads["z_proj.weight"].T + heads["z_proj.bias"]).view(len(ids), m.z_slots, -1)
            return peft(inputs_embeds=emb, attention_mask=mask, position_ids=pos).logits

    real = b.gen_mask.bool()
    right = logits(b.gen_ids, b.gen_mask, b.z_slot_pos)
    assert (right - want)[real].abs().max() < 1e-5
    ids, mask, shift, pos = left_pad(b.gen_ids, b.gen_mask, tok.pad_token_id)
    left = realign(logits(ids, mask, b.z_slot_pos + shift[:, None], pos), shift)
    assert (left - want)[real].abs().max() < 1e-5
    # negative control: the entangled model without the adapter is another function
    with torch.no_grad(), peft.disable_adapter():
        plain = logits(b.gen_ids, b.gen_mask, b.z_slot_pos)
    assert (plain - want)[real].abs().max() > 1e-3


def test_posterior_adapter_reproduces_mu_q(cell):
    m, tok = cell["model"], cell["tok"]
    b = batching.collate(encoding.encode(cell["df"], tok, m.z_slots), range(len(cell["df"])))
    with torch.no_grad():
        want = m.posterior(b.post_ids, b.post_mask)[0]
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(cell["base"]), cell["train"] / "adapters" / "posterior"
    ).eval()
    heads = load_file(cell["train"] / "heads" / "heads.safetensors")

    def mu_q(ids, mask, last, pos=None):
        with torch.no_grad():
            h = peft(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True).hidden_states[-1]
            pooled = h[torch.arange(len(ids)), last]
            return (pooled @ heads["posterior_head.proj.weight"].T + heads["posterior_head.proj.bias"]).chunk(2, -1)[0]

    assert (mu_q(b.post_ids, b.post_mask, b.post_mask.sum(1) - 1) - want).abs().max() < 1e-5
    ids, mask, _, pos = left_pad(b.post_ids, b.post_mask, tok.pad_token_id)
    assert (mu_q(ids, mask, torch.full((len(ids),), ids.shape[1] - 1), pos) - want).abs().max() < 1e-5


def test_readme_snippet_generates_what_the_project_decodes(cell, capsys):
    """The "Open a trained cell" snippet (docs/open-a-cell.md), run on this cell, generates the ids
    the project's decoding (latentstrat.modeling.decode) generates from the same z."""
    readme = (ROOT / "docs" / "open-a-cell.md").read_text()
    section = readme.split("# Open a trained cell", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = re.sub(r'^base = ".*"$', f'base = "{cell["base"]}"', code, flags=re.M)
    code = re.sub(r'^cell = ".*"$', f'cell = "{cell["train"]}"', code, flags=re.M)
    ns = {}
    exec(compile(code, "docs/open-a-cell.md", "exec"), ns)
    printed = capsys.readouterr().out
    x = re.search(r'tok\("<bos> <x> (.*?) </x>', code).group(1)
    gen = decode.generate(cell["model"], cell["tok"], [x], z=ns["z"][None], decoding=decode.Decoding(max_new_tokens=64))
    assert ns["out"][0].tolist() == gen.token_ids[0]
    assert " ".join(printed.split("</y>")[0].split()) == gen.texts[0]


def test_the_model_folder_opens_with_autotokenizer(cell, tiny_base):
    """AutoTokenizer on the entangled model's folder is the data stage's tokenizer: the same ids
    for every text of the data, the same decoded text (a word-level vocabulary is not rebuilt as
    the model family's byte-level BPE)."""
    auto, ours = AutoTokenizer.from_pretrained(cell["base"]), cell["tok"]
    texts = [
        t
        for s in encoding.SPLITS
        for t in (lambda d: d.x.tolist() + d.y.tolist())(encoding.load_split(tiny_base["data_dir"], s))
    ]
    ids = auto(texts, add_special_tokens=False).input_ids
    assert ids == ours(texts, add_special_tokens=False).input_ids
    assert [auto.decode(i) for i in ids[:50]] == [ours.decode(i) for i in ids[:50]]
    assert auto.pad_token == encoding.PAD and auto.eos_token == encoding.EOS
    assert "AutoModelForCausalLM" in (cell["base"] / "README.md").read_text()
