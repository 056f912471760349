"""What the workflow checks about a base before it builds any job, and how it reads a lost base.

- `base_problem`: a base folder built with other settings is never reused (its guard, the
  data stage's base_config.json), and `entangle.mode: shipped` needs the base this repository
  ships;
- `lost_base_stages`: the base stages (data, entangle, reference, step0: Snakemake checkpoints)
  whose outputs are gone while work that reads them exists. The workflow then asks for each later
  job's inputs only once those stages are back, so Snakemake decides again which later jobs need
  to run, and outputs that came back with the same bytes rerun nothing (docs/rerun-policy.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from latentstrat.base.shipped import MANIFEST, bases_root
from latentstrat.config import Base, base_guard
from latentstrat.paths import Paths
from latentstrat.stages import BASE_STAGES, BY_NAME


def base_problem(base: Base, paths: Paths, repository: str | Path) -> str | None:
    """Why the config's `base` cannot run on its base folder, or None: one built with other settings
    (its guard), an unreadable guard, or `entangle.mode: shipped` with no such shipped base."""
    if paths.base_config.exists():
        try:
            stored = json.loads(paths.base_config.read_text())
        except json.JSONDecodeError as e:
            return f"{paths.base_config} is not valid JSON ({e}); delete it or the base"
        why = base_guard(stored, base)
        if why:
            return f"{why} (base folder: {paths.base_dir})"
    manifest = shipped_manifest(base.name, repository)
    if base.mode == "shipped" and not manifest.is_file():
        shipped = manifest.parent
        have = sorted(d.name for d in shipped.parent.glob("*/")) if shipped.parent.is_dir() else []
        return (
            f"entangle.mode is 'shipped' but this repository ships no base {base.name!r} ({shipped} has no "
            f"{MANIFEST}; shipped bases: {', '.join(have) or 'none'}). "
            "Train it with --config entangle='{mode: train}'."
        )
    return None


def shipped_manifest(name: str, repository: str | Path) -> Path:
    """The manifest of the base this repository ships under the name `name` (the config's `base`)."""
    return bases_root(repository) / name / MANIFEST


def upstream(stage: str) -> tuple[str, ...]:
    """The base stages a stage's jobs read: its declaration's for a base stage, all of them for a
    later stage (or "cell": every rule after the base)."""
    return BY_NAME[stage].reads if stage in BASE_STAGES else BASE_STAGES


def base_stage_files(paths: Paths, inits, mode: str) -> dict[str, list[str]]:
    """Every output of each base stage (step0: of every init the collection's cells start from)."""
    return {s: paths.job_files(s, inits, mode, ()) for s in BASE_STAGES}


def lost_base_stages(paths: Paths, cell_inits: dict[str, str], mode: str) -> list[str]:
    """The base stages with a missing output while what reads it (a later base stage's output or
    a trained cell) exists: a lost base folder, not a base still to be built. `cell_inits`: cell
    id -> its init id. A step-0 validation is lost only when a cell that starts from its model
    was trained: a new setting's (its own training seed, its own model) is still to be built."""
    files = base_stage_files(paths, sorted(set(cell_inits.values())), mode)
    trained = {cid: Path(paths.train_files(cid)["summary"]).exists() for cid in cell_inits}
    # what reads a stage's outputs, not what comes after it in order: step0 does not read the
    # reference, so a reference still to run beside a finished step0 is not lost
    readers = {s: [f for t in BASE_STAGES if s in upstream(t) for f in files[t]] for s in BASE_STAGES}

    def missing(fs) -> bool:
        return any(not Path(f).exists() for f in fs)

    def lost(s: str) -> bool:
        if BY_NAME[s].level == "init":
            return any(trained[cid] and missing(paths.step0_files(iid).values()) for cid, iid in cell_inits.items())
        return missing(files[s]) and (any(Path(f).exists() for f in readers[s]) or any(trained.values()))

    return [s for s in BASE_STAGES if lost(s)]
