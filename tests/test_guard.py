"""The checks the workflow makes before any job, tested in the package: the base's guard, the
shipped base, a lost base (latentstrat.base.guard) and the rules' layout (latentstrat.rules)."""

import json
from pathlib import Path

from latentstrat.base.guard import BASE_STAGES, base_problem, lost_base_stages, upstream
from latentstrat.cells import expand_cells, init_id
from latentstrat.config import Base, load_config
from latentstrat.paths import Paths
from latentstrat.rules import WILDCARD, layout_problem
from latentstrat.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]


def _smoke(tmp_path, **overrides):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results"), **overrides})
    return cfg, Paths.from_config(cfg)


def _touch(files):
    for f in files:
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        Path(f).write_text("x")


def test_a_base_built_with_other_settings_or_a_missing_shipped_base_is_named(tmp_path):
    cfg, p = _smoke(tmp_path)
    assert base_problem(Base.of(cfg), p, ROOT) is None  # nothing built yet: the positive control
    _touch([p.base_config])
    p.base_config.write_text(json.dumps(Base.of(cfg).settings()))
    assert base_problem(Base.of(cfg), p, ROOT) is None  # built with these settings
    other = {**Base.of(cfg).settings(), "data": {**Base.of(cfg).settings()["data"], "seed": 1}}
    p.base_config.write_text(json.dumps(other))
    why = base_problem(Base.of(cfg), p, ROOT)
    assert why and "was built with different settings" in why and str(p.base_dir) in why
    p.base_config.write_text("{not json")
    assert "is not valid JSON" in base_problem(Base.of(cfg), p, ROOT)
    cfg, p = _smoke(tmp_path / "shipped", entangle={"mode": "shipped"}, base="no-such-base")
    why = base_problem(Base.of(cfg), p, ROOT)
    assert "ships no base 'no-such-base'" in why and "quick-2task-v6" in why  # names what is shipped


def test_a_base_stage_is_lost_only_when_what_reads_it_exists(tmp_path):
    cfg, p = _smoke(tmp_path)
    inits = {c.cell_id: init_id(c.settings) for c in expand_cells(cfg)}
    assert upstream("entangle") == ("data",) and upstream("train") == upstream("cell") == BASE_STAGES
    assert lost_base_stages(p, inits, "train") == []  # a fresh base: nothing lost
    data = p.job_files("data", [], "train", ())
    entangle = p.job_files("entangle", [], "train", ())
    _touch(data + entangle)
    assert lost_base_stages(p, inits, "train") == []  # the reference still to run: not lost
    step0 = p.step0_files(next(iter(inits.values()))).values()
    _touch(step0)
    assert lost_base_stages(p, inits, "train") == []  # step0 does not read the reference
    for f in entangle:
        Path(f).unlink()
    assert lost_base_stages(p, inits, "train") == ["entangle"]  # step0 reads it: lost
    _touch(entangle)
    cid, iid = next(iter(inits.items()))
    _touch([p.train_files(cid)["summary"]])  # a trained cell reads every base stage
    assert lost_base_stages(p, inits, "train") == ["reference"]
    _touch(p.job_files("reference", [], "train", ()))
    for f in p.step0_files(iid).values():
        Path(f).unlink()
    assert lost_base_stages(p, inits, "train") == ["step0"]  # its trained cell's init is gone


def test_the_layout_check_names_the_rule_and_the_file(tmp_path):
    cfg, p = _smoke(tmp_path)
    tasks = list(cfg["data"]["tasks"])

    def declared():
        out = {}
        for s in STAGES:
            key = WILDCARD.get(s.level, "")
            files = p.stage_files(s.name, key, "train", tasks)
            outputs = dict(enumerate(files.values())) if s.name == "probes" else files
            out[s.name] = (outputs, p.log_path(s.name, key), p.bench_path(s.name, key))
        return out

    assert layout_problem(p, declared(), "train", tasks) is None
    moved = declared()
    moved["train"][0]["history"] = moved["train"][0]["history"].replace("history.parquet", "hist.parquet")
    why = layout_problem(p, moved, "train", tasks)
    assert why.startswith("rule train (workflow/rules/train.smk): its history is") and "hist.parquet" in why
    missing = declared()
    del missing["report"]
    assert "stage report is declared (latentstrat.stages) but no rule report is" in layout_problem(
        p, missing, "train", tasks
    )
