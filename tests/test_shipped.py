"""Shipped entangled models: a small base trained with the recipe, shipped, installed again with
`entangle.mode: shipped` (same bytes, quality rechecked), and every way an artifact can be wrong
named before any cell uses it. The default and quick collections' shipped bases are checked too."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from latentstrat.base import data, shipped
from latentstrat.base.entangle import run_entangle
from latentstrat.config import Base, load_config
from latentstrat.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
# thresholds at 0: a 20-step model passes, so the shipping path (which refuses failing models) runs
LENIENT = {"quality_min_answer_accuracy": 0.0, "quality_min_strategy_match": 0.0, "quality_max_strategy_tv": 1.0}


def cfg_with(mode="train", **over):
    o = {
        "data": {"train_per_task": 8, "validation_per_task": 3, "test_per_task": 3},
        "entangle": {
            "mode": mode,
            "steps": 4,
            "batch_size": 8,
            "warmup_steps": 1,
            "quality_samples_per_task": 2,
            **LENIENT,
        },
    }
    for k, v in over.items():
        o.setdefault(k, {}).update(v)
    return load_config(ROOT / "config" / "smoke.yaml", overrides=o)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A base trained with the recipe (entangle.mode train) and shipped from it."""
    root = tmp_path_factory.mktemp("shipped")
    cfg = cfg_with()
    data.build_dataset(cfg["data"], root / "data", base_config=Base.of(cfg).settings())
    run_entangle(cfg, root / "data", root / "entangle", threads=1, log=lambda m: None)
    prov = shipped.ship(Base.of(cfg), root / "data", root / "entangle", root / "ship")
    return root, cfg, prov


def test_ship_then_install_gives_the_same_model_and_rechecks_quality(trained, tmp_path):
    root, cfg, prov = trained
    files = sorted(p.relative_to(root / "ship").as_posix() for p in (root / "ship").rglob("*") if p.is_file())
    assert {
        "SHA256SUMS",
        "provenance.json",
        "history.parquet",
        "quality.json",
        "model/config.json",
        "model/model.safetensors",
        "reference/tokens.parquet",
    } <= set(files)
    assert prov["reference"]["code_version"] and prov["reference"]["cpu"]
    assert prov["recipe"] == json.loads(json.dumps(Base.of(cfg).settings(), default=str))
    assert "mode" not in prov["recipe"]["entangle"]  # how the model is obtained is not the recipe
    assert prov["trained"]["code_version"] and prov["trained"]["cpu"]
    assert len(prov["data_fingerprint"]) == 64

    report = run_entangle(
        cfg_with("shipped"), root / "data", tmp_path, threads=1, log=lambda m: None, shipped_dir=root / "ship"
    )
    for f in ("config.json", "model.safetensors"):
        assert (tmp_path / "model" / f).read_bytes() == (root / "entangle" / "model" / f).read_bytes()
    q = json.loads((tmp_path / "quality.json").read_text())
    assert q["mode"] == "shipped" and report["mode"] == "shipped"
    assert q["shipped"]["data_fingerprint"] == prov["data_fingerprint"] and q["host"]["cpu"]
    assert set(q["tasks"]) == set(cfg["data"]["tasks"]) and (tmp_path / "quality.parquet").exists()
    # an installed (not trained) base is not shipped again
    with pytest.raises(shipped.ShippedBaseError, match="not trained here"):
        shipped.ship(Base.of(cfg), root / "data", tmp_path, tmp_path / "again")


def _copy(root, tmp_path):
    d = tmp_path / "ship"
    shutil.copytree(root / "ship", d)
    return d


def test_a_corrupt_missing_or_unlisted_file_is_named(trained, tmp_path):
    root, cfg, _ = trained
    d = _copy(root, tmp_path)
    w = d / "model" / "model.safetensors"
    blob = bytearray(w.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    w.write_bytes(bytes(blob))
    with pytest.raises(shipped.ShippedBaseError, match=r"model/model.safetensors fails its checksum.*git checkout"):
        shipped.verify(d, Base.of(cfg), root / "data")
    w.unlink()
    with pytest.raises(shipped.ShippedBaseError, match="model/model.safetensors is listed in SHA256SUMS but missing"):
        shipped.verify(d, Base.of(cfg), root / "data")
    d = _copy(root, tmp_path / "b")
    (d / "model" / "extra.bin").write_bytes(b"x")
    with pytest.raises(shipped.ShippedBaseError, match="model/extra.bin is not in SHA256SUMS"):
        shipped.verify(d, Base.of(cfg), root / "data")
    (d / "SHA256SUMS").unlink()
    with pytest.raises(shipped.ShippedBaseError, match=r"no shipped base.*entangle='\{mode: train\}'"):
        shipped.verify(d, Base.of(cfg), root / "data")
    # nothing was installed from a bad artifact
    out = tmp_path / "out"
    with pytest.raises(shipped.ShippedBaseError):
        run_entangle(cfg_with("shipped"), root / "data", out, threads=1, shipped_dir=d)
    assert not (out / "model").exists() and not (out / "quality.json").exists()


def test_the_shipped_reference_table_is_the_one_computed_here_and_a_wrong_one_is_named(trained, tmp_path):
    """With entangle.mode shipped the reference stage reads the shipped table: equal to computing
    b here; a table off by 0.01 nats on one validation token, or missing a row, is an error that
    names the table; a base shipped before tables were shipped gets one (`add_reference`)."""
    import numpy as np
    import pandas as pd

    from latentstrat.base.reference import run_reference
    from latentstrat.io import write_parquet

    root, cfg, _ = trained
    here = run_reference(cfg, root / "data", root / "entangle", tmp_path / "here", log=lambda m: None)
    installed = tmp_path / "installed"
    run_entangle(
        cfg_with("shipped"), root / "data", installed, threads=1, log=lambda m: None, shipped_dir=root / "ship"
    )
    got = run_reference(cfg_with("shipped"), root / "data", installed, tmp_path / "shipped", log=lambda m: None)
    assert got["b_source"].startswith("the table shipped with the base") and here["b_source"] == "computed here"
    assert got["S_ref"] == here["S_ref"] and got["T_ref"] == here["T_ref"]
    a, b = (pd.read_parquet(tmp_path / d / "tokens.parquet") for d in ("here", "shipped"))
    assert a[["task", "example_id", "split"]].equals(b[["task", "example_id", "split"]])
    assert all(np.array_equal(x, y) for x, y in zip(a.b, b.b))

    table = installed / "reference_tokens.parquet"
    tokens = pd.read_parquet(table)
    v = tokens.index[tokens.split == "validation"][1]
    tokens.at[v, "b"] = tokens.b[v] + np.float32(0.01) * (np.arange(len(tokens.b[v])) == 0)
    write_parquet(tokens, table)
    with pytest.raises(ValueError, match=f"shipped reference table {table}: b recomputed here differs by 0.01"):
        run_reference(cfg_with("shipped"), root / "data", installed, tmp_path / "bad", log=lambda m: None)
    write_parquet(tokens.drop(index=0), table)
    with pytest.raises(ValueError, match="train rows are not the data stage's examples"):
        run_reference(cfg_with("shipped"), root / "data", installed, tmp_path / "bad", log=lambda m: None)

    d = _copy(root, tmp_path / "old")
    (d / "reference" / "tokens.parquet").unlink()
    sums = d / "SHA256SUMS"
    sums.write_text("".join(x for x in sums.read_text().splitlines(keepends=True) if "reference/" not in x))
    with pytest.raises(shipped.ShippedBaseError, match="reference/tokens.parquet is missing"):
        shipped.verify(d, Base.of(cfg), root / "data")
    shipped.add_reference(Base.of(cfg), root / "data", d)
    assert shipped.verify(d, Base.of(cfg), root / "data")["reference"]["cpu"]
    assert (d / "reference" / "tokens.parquet").read_bytes() == (
        root / "ship" / "reference" / "tokens.parquet"
    ).read_bytes()


def test_another_recipe_or_other_data_is_refused(trained, tmp_path):
    root, cfg, _ = trained
    with pytest.raises(shipped.ShippedBaseError, match=r"another recipe.*entangle\.steps"):
        shipped.verify(root / "ship", Base.of(cfg_with(entangle={"steps": 5})), root / "data")
    other = cfg_with(data={"seed": 8})
    data.build_dataset(other["data"], tmp_path / "data")
    with pytest.raises(shipped.ShippedBaseError, match="other data"):
        shipped.verify(root / "ship", Base.of(cfg), tmp_path / "data")
    # the mode is not part of the recipe: a train-mode config matches its own shipped base
    assert shipped.verify(root / "ship", Base.of(cfg_with("shipped")), root / "data")["base"] == cfg["base"]


def test_failing_quality_is_not_shipped(trained, tmp_path):
    root, cfg, _ = trained
    d = tmp_path / "entangle"
    shutil.copytree(root / "entangle", d)
    q = json.loads((d / "quality.json").read_text())
    (d / "quality.json").write_text(json.dumps({**q, "passed": False}))
    with pytest.raises(shipped.ShippedBaseError, match="passing quality checks"):
        shipped.ship(Base.of(cfg), root / "data", d, tmp_path / "ship")


@pytest.mark.parametrize("config", ["config.yaml", "quick.yaml"])
def test_default_and_quick_collections_ship_their_base(config):
    """The default and quick configs use the shipped base, and the artifact in the repository
    matches their recipe (checksums listed, trained from clean code)."""
    cfg = load_config(ROOT / "config" / config)
    assert cfg["entangle"]["mode"] == "shipped"
    d = shipped.bases_root(ROOT) / cfg["base"]
    manifest = (d / "SHA256SUMS").read_text()
    assert "model/model.safetensors" in manifest
    prov = json.loads((d / "provenance.json").read_text())
    assert prov["recipe"] == json.loads(json.dumps(Base.of(cfg).settings(), default=str))
    assert not prov["trained"]["code_dirty"] and len(prov["trained"]["code_commit"]) == 40
    assert "reference/tokens.parquet" in manifest and not prov["reference"]["code_dirty"]


@pytest.mark.parametrize("config", ["quick.yaml", pytest.param("config.yaml", marks=pytest.mark.slow)])
def test_shipped_base_verifies_against_a_fresh_data_stage(config, tmp_path):
    cfg = load_config(ROOT / "config" / config)
    data.build_dataset(cfg["data"], tmp_path, base_config=Base.of(cfg).settings())
    prov = shipped.verify(shipped.bases_root(ROOT) / cfg["base"], Base.of(cfg), tmp_path)
    assert prov["quality_passed"] and Paths.from_config(cfg).base == prov["base"]


def test_workflow_names_a_missing_shipped_base(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--directory",
            str(ROOT),
            "--config",
            f"results_dir={tmp_path}",
            "base=no-such-base",
            "entangle={mode: shipped}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode != 0
    assert "ships no base 'no-such-base'" in r.stdout + r.stderr and "mode: train" in r.stdout + r.stderr
