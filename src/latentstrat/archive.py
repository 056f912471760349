"""A collection's finished cells in a folder git can hold, so that a collection that takes longer
than one machine's day moves between machines (docs/archive.md).

`export` copies what the aggregate and the report read of each finished cell — its metrics row
and bootstrap replicates (the tabulate stage's), its training history and summary (provenance:
every host it trained on, CPU model, code hash) — into `<results_dir>/archive/<collection>/`,
with checksums in MANIFEST. Nothing else: no weights, checkpoints, optimizer state, evaluation
records or probe tables (those are 3 MB a cell; their numbers are in the row). It exports pairs
whole: the cells of one setting and replicate in every arm (cells.pair_priorities), all trained,
evaluated and probed on one kind of machine with one code, or none of them.

The workflow reads the archive where it finds one (`archived_cells`): an archived cell's jobs
are not in the DAG (`snakemake -n` lists only the cells still to run) and the aggregate reads its
files from the archive. A manifest that does not match its files, another collection's or another
grid's archive, a half pair, or tables of another CELL_TABLES_VERSION is an ArchiveError naming
the file and the fix, before any job runs.

    python -m latentstrat.archive export --configfile config/config.yaml [--from OTHER/results]
    python -m latentstrat.archive check  --configfile config/config.yaml
    python -m latentstrat.archive plan   --configfile config/config.yaml   # what is left, and how to run it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from latentstrat.cells import Cell, pair_priorities
from latentstrat.io import current_umask, dump_json
from latentstrat.metrics import BOOTSTRAP_FILE, CELL_TABLES_VERSION
from latentstrat.paths import Paths

MANIFEST = "manifest.json"
ARCHIVE_VERSION = 1
# what an archived cell keeps, by the name it has in the archive: the tabulate stage's row and
# bootstrap (side by side, as the aggregate reads them) and the train stage's history and summary
CELL_FILES = {
    "row": "row.parquet",
    "bootstrap": BOOTSTRAP_FILE,
    "history": "history.parquet",
    "summary": "summary.json",
}
# what the cells of one pair must share, train segment by segment and in their evaluate and probe
# stages: one kind of machine and one code (a cell's numbers move with its CPU)
SAME_MACHINE = ("cpu", "cpu_capability", "code_hash")


class ArchiveError(ValueError):
    """An archive that cannot be used as it is: the message names the file and the fix."""


def archive_dir(paths: Paths) -> Path:
    return paths.results / "archive" / paths.collection


def source_files(paths: Paths, cid: str) -> dict[str, Path]:
    """Where a cell's archived files are in a results folder (the tabulate and train stages')."""
    train = paths.train_files(cid)
    return {
        "row": paths.row_path(cid),
        "bootstrap": paths.bootstrap_path(cid),
        "history": Path(train["history"]),
        "summary": Path(train["summary"]),
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pairs_of(cells: list[Cell]) -> dict[int, list[str]]:
    """Pair number -> its cells' ids (cells.pair_priorities: one setting and replicate in every arm)."""
    out: dict[int, list[str]] = {}
    for cid, p in pair_priorities(cells).items():
        out.setdefault(p, []).append(cid)
    return out


# ----------------------------------------------------------------------------- reading


def read_manifest(paths: Paths) -> dict | None:
    p = archive_dir(paths) / MANIFEST
    if not p.exists():
        if (archive_dir(paths) / "cells").exists():
            raise ArchiveError(
                f"archive {archive_dir(paths)} has cells but no {MANIFEST}: a partial copy. Restore it from git "
                f"(git checkout -- {archive_dir(paths)}) or remove the folder and export again"
            )
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ArchiveError(f"archive manifest {p} is not valid JSON ({e}): restore it from git") from None


def archived_cells(paths: Paths, cells: list[Cell]) -> dict[str, dict[str, str]]:
    """Cell id -> {row, bootstrap, history, summary: its archived files} of this collection's
    archive, every file checked against the manifest; {} without an archive. Raises ArchiveError."""
    m = read_manifest(paths)
    if m is None:
        return {}
    check_manifest(m, paths, cells)
    out = {cid: checked_files(paths, m, cid) for cid in m["cells"]}
    for members in pairs_of(cells).values():
        have = [c for c in members if c in out]
        if have and len(have) != len(members):
            missing = sorted(set(members) - set(have))
            raise ArchiveError(
                f"archive {archive_dir(paths)} holds half of a pair: {missing} missing beside {have}: {FIX}"
            )
    return out


FIX = "export it again from the results it came from, or restore the folder from git"


def check_manifest(m: dict, paths: Paths, cells: list[Cell]) -> None:
    """The manifest is this code's, this collection's and this grid's (ArchiveError otherwise)."""
    where = archive_dir(paths) / MANIFEST
    if m.get("archive_version") != ARCHIVE_VERSION:
        raise ArchiveError(
            f"archive manifest {where}: version {m.get('archive_version')}, this code reads {ARCHIVE_VERSION}"
        )
    if m.get("tables_version") != CELL_TABLES_VERSION:
        raise ArchiveError(
            f"archive manifest {where}: its rows are cell tables version {m.get('tables_version')}, this code reads "
            f"version {CELL_TABLES_VERSION} (latentstrat.metrics.CELL_TABLES_VERSION): aggregate it from a checkout of "
            f"its commit {m.get('code_commit')} (git worktree add ../archive-code {m.get('code_commit')}), or retrain"
        )
    for key, want in (("collection", paths.collection), ("base", paths.base), ("work_key", paths.work_key)):
        if m.get(key) != want:
            raise ArchiveError(
                f"archive manifest {where}: made for {key} {m.get(key)!r}, this config has {want!r} (a change of the "
                "lora/train/evaluate/probes sections makes new cells): undo the change, or move the archive aside"
            )
    foreign = sorted(set(m.get("cells", {})) - {c.cell_id for c in cells})
    if foreign:
        raise ArchiveError(f"archive manifest {where}: cells {foreign[:3]} are not in this collection's grid: {FIX}")


def checked_files(paths: Paths, m: dict, cid: str) -> dict[str, str]:
    """One archived cell's files, each present and matching its checksum, its code the archive's."""
    entry, files = m["cells"][cid], {}
    for name, rel in CELL_FILES.items():
        f = archive_dir(paths) / "cells" / cid / rel
        if not f.exists():
            raise ArchiveError(f"archive file {f} is missing (the archive is partial): {FIX}")
        if sha256(f) != entry["sha256"][name]:
            where = archive_dir(paths) / MANIFEST
            raise ArchiveError(f"archive file {f} does not match its checksum in {where} (changed by hand?): {FIX}")
        files[name] = str(f)
    if entry.get("code_hash") != m.get("code_hash"):
        raise ArchiveError(
            f"archive manifest {archive_dir(paths) / MANIFEST}: cell {cid} was trained with code "
            f"{entry.get('code_hash')}, the archive's cells with {m.get('code_hash')}: one archive, one code. {FIX}"
        )
    return files


# ----------------------------------------------------------------------------- exporting


def cell_machines(files: dict[str, Path]) -> list[dict]:
    """Every machine and code a cell's numbers came from: its train segments (summary `hosts`),
    its evaluate and probes stages (its row's evaluate_* / probes_* columns). A value not
    recorded is None."""
    summary = json.loads(Path(files["summary"]).read_text())
    segments = summary.get("hosts") or [{k: summary.get(k) for k in SAME_MACHINE}]
    row = pd.read_parquet(files["row"]).iloc[0]
    stages = [{k: row.get(f"{s}_{k}") for k in SAME_MACHINE} for s in ("evaluate", "probes")]
    return [{k: seg.get(k) for k in SAME_MACHINE} for seg in segments] + stages


def pair_problem(machines: dict[str, list[dict]]) -> str | None:
    """Why a pair's cells (cell id -> cell_machines) are not all from one kind of machine and one
    code, or None. A value not recorded is unknown: the pair cannot be shown whole."""
    seen = set()
    for cid, ms in machines.items():
        for m in ms:
            unknown = [k for k in SAME_MACHINE if m.get(k) in (None, "")]
            if unknown:
                return f"{cid} does not record its {', '.join(unknown)}"
            seen.add(tuple(m[k] for k in SAME_MACHINE))
    if len(seen) > 1:
        return "its cells ran on different machines or code: " + "; ".join(
            " / ".join(map(str, s)) for s in sorted(seen)
        )
    return None


def export(source: Paths, dest: Paths, cells: list[Cell], log=print) -> dict:
    """Copy every finished pair of `source` (a results folder's cells) that the archive of `dest`
    does not hold yet into it, with its checksums, and rewrite the manifest. A pair is finished
    when all its cells have their four files; it is exported only when `export_problem` finds
    nothing. Returns {exported, skipped: {pair cells: why}, cells}."""
    held = archived_cells(dest, cells)
    m = read_manifest(dest) or {
        "archive_version": ARCHIVE_VERSION,
        "collection": dest.collection,
        "base": dest.base,
        "work_key": dest.work_key,
        "tables_version": CELL_TABLES_VERSION,
        "code_hash": None,
        "code_commit": None,
        "cells": {},
    }
    exported, skipped = [], {}
    for _, members in sorted(pairs_of(cells).items(), reverse=True):
        if all(c in held for c in members):
            continue
        files = {c: source_files(source, c) for c in members}
        absent = [c for c in members if not all(f.exists() for f in files[c].values())]
        if absent:
            if len(absent) < len(members):
                skipped[", ".join(members)] = f"not finished: {', '.join(absent)}"
            continue
        summaries = {c: json.loads(files[c]["summary"].read_text()) for c in members}
        why = export_problem(files, summaries, m)
        if why:
            skipped[", ".join(members)] = why
            continue
        for c in members:
            m["cells"][c] = copy_cell(files[c], summaries[c], archive_dir(dest) / "cells" / c)
            m["code_hash"], m["code_commit"] = summaries[c].get("code_hash"), summaries[c].get("code_commit")
        exported += members
        log(f"exported pair {', '.join(members)}")
    if exported:
        dump_json(m, archive_dir(dest) / MANIFEST)
    return {"exported": exported, "skipped": skipped, "cells": len(m["cells"])}


def export_problem(files: dict, summaries: dict, m: dict) -> str | None:
    """Why a finished pair (cell id -> its files, its train summary) may not join the archive
    `m`: its cells' machines or code differ (pair_problem), or its code is not the archive's."""
    why = pair_problem({c: cell_machines(f) for c, f in files.items()})
    code = {s.get("code_hash") for s in summaries.values()}
    if why is None and m["code_hash"] is not None and code != {m["code_hash"]}:
        why = (
            f"trained with code {', '.join(map(str, code))}, the archive's cells with {m['code_hash']} (commit "
            f"{m['code_commit']}): train the rest from a checkout of that commit (docs/archive.md)"
        )
    return why


def copy_cell(files: dict[str, Path], summary: dict, target: Path) -> dict:
    """Copy one cell's files into `target` (a temporary folder renamed into place, so a cell is
    there whole or not at all); returns its manifest entry."""
    parent = _mkdir(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it 0700
    for name, rel in CELL_FILES.items():
        shutil.copyfile(files[name], tmp / rel)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return {
        "sha256": {name: sha256(target / rel) for name, rel in CELL_FILES.items()},
        "code_hash": summary.get("code_hash"),
        "code_commit": summary.get("code_commit"),
        "machines": sorted({f"{h.get('cpu')} ({h.get('cpu_capability')})" for h in summary.get("hosts") or [summary]}),
        "finished_at": summary.get("finished_at"),
    }


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def archive_size(paths: Paths) -> int:
    """Bytes of the archive folder."""
    root = archive_dir(paths)
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


# ----------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    from latentstrat.cells import expand_cells
    from latentstrat.config import config_for_command

    ap = argparse.ArgumentParser(prog="python -m latentstrat.archive", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["export", "check", "plan"])
    ap.add_argument("--configfile", default="config/config.yaml")
    ap.add_argument("--from", dest="source", help="the results folder the cells trained in (default: this config's)")
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    cells, dest = expand_cells(cfg), Paths.from_config(cfg)
    try:
        if args.action == "export":
            source = Paths.from_config({**cfg, "results_dir": args.source}) if args.source else dest
            r = export(source, dest, cells)
            for members, why in r["skipped"].items():
                print(f"skipped pair {members}: {why}")
            print(
                f"{archive_dir(dest)}: {len(r['exported'])} cells exported, {r['cells']} of {len(cells)} archived, "
                f"{archive_size(dest) / 1e6:.1f} MB"
            )
            return 0
        held = archived_cells(dest, cells)
    except ArchiveError as e:
        print(f"archive: {e}", file=sys.stderr)
        return 2
    m = read_manifest(dest) or {}
    print(f"{archive_dir(dest)}: {len(held)} of {len(cells)} cells of {dest.collection} archived, checksums ok")
    if args.action == "plan":
        left = [c for c in cells if c.cell_id not in held]
        if not left:
            print("nothing left to train")
            return 0
        targets = " ".join(str(dest.row_path(c.cell_id)) for c in left)
        commit = m.get("code_commit") or "HEAD"
        print(
            f"{len(left)} cells left. Train them with the archive's code (commit {commit}):\n"
            f"  git worktree add ../frozen {commit} && cd ../frozen && bash scripts/setup.sh\n"
            # targets before --configfile: Snakemake's --configfile takes every word after it
            f"  nice -n 19 .venv/bin/snakemake --cores 2 {targets} --configfile {args.configfile}\n"
            f"then, here: python -m latentstrat.archive export --configfile {args.configfile} --from ../frozen/results"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
