"""Shipped entangled models: a base's entangled model trained once, kept in the repository
with its provenance and checksums, so a collection on that base does not train it again.

    python -m latentstrat.base.shipped --configfile config/config.yaml     # ship the config's base

A shipped base is a folder `resources/bases/<base>/`:

| file | what |
|---|---|
| model/ | the entangled model (save_pretrained), its tokenizer and a model card (transformers' Auto classes) |
| history.parquet, quality.json | the entangle stage's training history and quality report |
| reference/tokens.parquet | the reference table: b of every example of every split under this model |
| provenance.json | the recipe (config.Base.recipe), data fingerprint, code, host and step settings of its training |
| SHA256SUMS | sha256 of every other file (`sha256sum -c` format) |

With `entangle.mode: shipped` the entangle stage installs it (`install`): every checksum is
verified, the recipe must equal the config's and the data fingerprint the data stage's, each
mismatch an error naming the file or the keys; then the model (and the reference table, which the reference
stage checks against this host) is copied into the base and the quality checks run again on
this host. `entangle.mode: train` retrains it from the same recipe.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

from latentstrat import encoding
from latentstrat.config import Base, config_for_command, settings_diff
from latentstrat.io import dump_json
from latentstrat.paths import ENTANGLE_FILES, ENTANGLE_RECORDS, SHIPPED_REFERENCE_FILE, Paths
from latentstrat.runtime import host

MANIFEST = "SHA256SUMS"
REFERENCE = "reference/tokens.parquet"
PROVENANCE = "provenance.json"
COPIED = tuple(ENTANGLE_RECORDS.values())  # from the entangle stage's folder, besides model/


class ShippedBaseError(RuntimeError):
    """A shipped base that is missing, corrupt, or not the one this config describes."""


def bases_root(repo_root: str | Path) -> Path:
    return Path(repo_root) / "resources" / "bases"


def data_fingerprint(data_dir: str | Path) -> str:
    """sha256 of the data stage's content: every split's examples (task, id, strategy, x, y) and
    the tokenizer's vocabulary. Independent of the parquet writer, so equal data on two hosts
    gives equal fingerprints."""

    h = hashlib.sha256()
    for split in encoding.SPLITS:
        df = encoding.load_split(data_dir, split)[["task", "example_id", "strategy", "x", "y"]]
        h.update(split.encode())
        h.update(df.to_json(orient="values").encode())
    vocab = encoding.load_tokenizer(data_dir).get_vocab()
    h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])).encode())
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def ship(base: Base, data_dir: str | Path, entangle_dir: str | Path, out_dir: str | Path) -> dict:
    """Write the shipped base `out_dir` from the trained `base` (its data and entangle folders).
    Refuses a base whose quality checks failed. Returns the provenance."""
    data_dir, entangle_dir, out_dir = Path(data_dir), Path(entangle_dir), Path(out_dir)
    quality = json.loads((entangle_dir / ENTANGLE_FILES["quality"]).read_text())
    if quality.get("mode") != "train" or not quality.get("passed"):
        raise ShippedBaseError(
            f"ship: the entangled model in {entangle_dir} was not trained here with passing quality checks "
            f"(mode {quality.get('mode')!r}, passed {quality.get('passed')!r}); only a checked model is shipped"
        )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(entangle_dir / "model", tmp / "model")
    for name in COPIED:
        shutil.copy2(entangle_dir / name, tmp / name)
    training = quality.get("training", {})
    provenance = {
        "base": base.name,
        "recipe": base.recipe(),
        "data_fingerprint": data_fingerprint(data_dir),
        "trained": {
            **training.get("code", {"code_version": "unknown"}),
            "cpu": training.get("step_choice", {}).get("host", {}).get("cpu", host.cpu_model()),
            "step_settings": training.get("step_choice", {}).get("chosen"),
            "wall_s": training.get("wall_s"),
            "train_tokens": training.get("train_tokens"),
        },
        "quality_passed": True,
        "shipped_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    provenance["reference"] = write_reference(base, data_dir, tmp)
    dump_json(provenance, tmp / PROVENANCE)
    _write_manifest(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return provenance


def _write_manifest(d: Path) -> None:
    (d / MANIFEST).write_text("".join(f"{_sha256(d / f)}  {f}\n" for f in _files(d)))


def write_reference(base: Base, data_dir: str | Path, shipped_dir: str | Path, threads: int = 2) -> dict:
    """The reference table of the shipped model in `shipped_dir` (every split of the data stage's
    output, latentstrat.base.reference) as REFERENCE; returns its provenance (code, host, when)."""
    import torch

    from latentstrat.base.reference import reference_tokens
    from latentstrat.io import write_parquet
    from latentstrat.modeling.backbone import load_entangled

    torch.set_num_threads(threads)
    tokenizer = encoding.load_tokenizer(data_dir)
    splits = {s: encoding.load_split(data_dir, s) for s in encoding.SPLITS}
    tokens = reference_tokens(load_entangled(shipped_dir), base.entangle, tokenizer, splits, log=lambda m: None)
    write_parquet(tokens, Path(shipped_dir) / REFERENCE)
    return {
        **host.code_version(),
        "cpu": host.cpu_model(),
        "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def add_reference(base: Base, data_dir: str | Path, shipped_dir: str | Path) -> dict:
    """(Re)write the reference table of an already shipped base, after its other files pass
    their checksums and match `base` and the data (`verify`); the manifest and provenance are
    rewritten with it. Returns the provenance."""
    d = Path(shipped_dir)
    prov = verify(d, base, data_dir, need_reference=False)
    prov["reference"] = write_reference(base, data_dir, d)
    dump_json(prov, d / PROVENANCE)
    _write_manifest(d)
    return prov


def add_model_extras(base: Base, data_dir: str | Path, shipped_dir: str | Path) -> None:
    """Put the tokenizer files and the model card (backbone.write_model_extras) into an already
    shipped base's model/ folder, after its files pass their checksums and match `base` and the
    data (`verify`); the manifest is rewritten."""
    from latentstrat.modeling.backbone import write_model_extras

    d = Path(shipped_dir)
    verify(d, base, data_dir, need_reference=False)
    write_model_extras(d / "model", encoding.load_tokenizer(data_dir), base)
    _write_manifest(d)


def requalify(base: Base, data_dir: str | Path, shipped_dir: str | Path) -> dict:
    """Rerun the quality checks of an already shipped base's model with this code (after a change
    to the sampler) and rewrite its quality.json, keeping its training record; refuses a model
    that no longer passes. The manifest is rewritten. Returns the new report."""
    import torch

    from latentstrat.base.quality import check_quality
    from latentstrat.modeling.backbone import load_entangled

    d = Path(shipped_dir)
    verify(d, base, data_dir)
    torch.set_num_threads(2)
    old = json.loads((d / ENTANGLE_FILES["quality"]).read_text())
    splits = {s: encoding.load_split(data_dir, s) for s in ("train", "validation")}
    ecfg = base.entangle
    report, _ = check_quality(
        load_entangled(d),
        encoding.load_tokenizer(data_dir),
        splits["validation"],
        splits["train"],
        ecfg,
        batch_size=2 * ecfg["batch_size"],
    )
    if not report["passed"]:
        raise ShippedBaseError(
            f"shipped base {d}: its model fails the quality checks with this code: {report['tasks']}"
        )
    report.update({k: v for k, v in old.items() if k not in report}, requalified=host.code_version()["code_version"])
    dump_json(report, d / ENTANGLE_FILES["quality"])
    _write_manifest(d)
    return report


def verify(shipped_dir: str | Path, base: Base, data_dir: str | Path, need_reference: bool = True) -> dict:
    """Check a shipped base against its checksums, `base`'s recipe and the data stage's
    output; return its provenance. Every failure names the file or the keys and how to go on."""
    d = Path(shipped_dir)
    retrain = "or retrain the base with `--config entangle='{mode: train}'`"
    if not (d / MANIFEST).is_file():
        raise ShippedBaseError(
            f"entangle.mode shipped: no shipped base at {d} ({MANIFEST} missing); "
            f"ship one with `python -m latentstrat.base.shipped --configfile ...` {retrain}"
        )
    listed = _checked_manifest(d, retrain)
    for name in ("model/config.json", PROVENANCE, *COPIED, *[REFERENCE] * need_reference):
        if name not in listed:
            raise ShippedBaseError(f"shipped base {d}: {name} is missing")
    prov = json.loads((d / PROVENANCE).read_text())
    diff = settings_diff(prov["recipe"], base.recipe())
    if diff:
        raise ShippedBaseError(
            f"shipped base {d} was trained from another recipe than this config's base "
            f"{base.name!r}: {', '.join(diff)} differ; use a new `base` name with "
            f"entangle.mode train for the new settings, {retrain}"
        )
    fp = data_fingerprint(data_dir)
    if fp != prov["data_fingerprint"]:
        raise ShippedBaseError(
            f"shipped base {d} was trained on other data than the data stage wrote to {data_dir} "
            f"(data fingerprint {fp[:12]}... != {prov['data_fingerprint'][:12]}...); {retrain}"
        )
    return prov


def _checked_manifest(d: Path, retrain: str) -> dict:
    """The shipped base's manifest ({file: sha256}) once every file in the folder is listed in it,
    present and matches its checksum."""
    listed = {}
    for n, line in enumerate((d / MANIFEST).read_text().splitlines(), 1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            raise ShippedBaseError(f"shipped base {d}: {MANIFEST} line {n} is not '<sha256>  <file>'")
        listed[name] = digest
    for name in sorted(set(_files(d)) | set(listed)):
        if name not in listed:
            raise ShippedBaseError(f"shipped base {d}: {name} is not in {MANIFEST} (an unchecked file)")
        if not (d / name).is_file():
            raise ShippedBaseError(
                f"shipped base {d}: {name} is listed in {MANIFEST} but missing; "
                f"restore it (git checkout -- {d}) {retrain}"
            )
        got = _sha256(d / name)
        if got != listed[name]:
            raise ShippedBaseError(
                f"shipped base {d}: {name} fails its checksum (sha256 {got[:12]}..., "
                f"{MANIFEST} says {listed[name][:12]}...): the file is corrupt or was edited; "
                f"restore it (git checkout -- {d}) {retrain}"
            )
    return listed


def install(shipped_dir: str | Path, base: Base, data_dir: str | Path, out_dir: str | Path) -> dict:
    """Verify the shipped base and copy its model and history into the entangle stage's folder
    (the model folder swapped in whole). Returns the provenance."""
    prov = verify(shipped_dir, base, data_dir)
    d, out_dir = Path(shipped_dir), Path(out_dir)
    tmp = out_dir / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(d / "model", tmp)
    final = out_dir / "model"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    history = ENTANGLE_FILES["entangle_history"]  # quality.json is written anew on this host
    shutil.copy2(d / history, out_dir / history)
    shutil.copy2(d / REFERENCE, out_dir / SHIPPED_REFERENCE_FILE)  # checked by the reference stage
    return {**prov, "shipped_dir": str(d)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.base.shipped", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", required=True, help="collection config YAML: its base is shipped")
    ap.add_argument("--to", help="destination folder (default: resources/bases/<base> of this checkout)")
    ap.add_argument(
        "--reference", action="store_true", help="only (re)compute the reference table of the already shipped base"
    )
    ap.add_argument(
        "--quality",
        action="store_true",
        help="only rerun the quality checks of the already shipped base's model and rewrite its quality.json",
    )
    ap.add_argument(
        "--model-extras",
        action="store_true",
        help="only add the tokenizer files and model card to the already shipped base's model/",
    )
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    paths, base = Paths.from_config(cfg), Base.of(cfg)
    out = Path(args.to) if args.to else bases_root(Path(__file__).resolve().parents[3]) / base.name
    if args.quality:
        report = requalify(base, paths.data_dir, out)
        print(f"quality of {base.name} -> {out / ENTANGLE_FILES['quality']} (passed {report['passed']})")
        return
    if args.model_extras:
        add_model_extras(base, paths.data_dir, out)
        print(f"tokenizer and model card -> {out / 'model'}")
        return
    if args.reference:
        prov = add_reference(base, paths.data_dir, out)
        print(f"reference table of {base.name} -> {out / REFERENCE} (code {prov['reference']['code_version']})")
        return
    prov = ship(base, paths.data_dir, paths.entangle_dir, out)
    print(
        f"shipped base {base.name} -> {out} (code {prov['trained']['code_version']}, data "
        f"{prov['data_fingerprint'][:12]})"
    )


if __name__ == "__main__":
    main()
