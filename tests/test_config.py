"""Config loading, validation errors that name the key, cells and canonical cell ids."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from latentstrat import cells as K
from latentstrat import config as C

ROOT = Path(__file__).resolve().parents[1]


def default_cfg():
    return C.load_config(ROOT / "config" / "config.yaml")


def minimal(**over):
    cfg = {"collection": "t", "base": "b", "data": {}, "grid": {"reconstruction_family": ["raw"], "beta": [0.1]}}
    cfg.update(over)
    return cfg


def test_default_collection_is_sum_against_the_matched_mean_arm_with_replicates_where_cells_are_bistable():
    cfg = default_cfg()
    cells = K.expand_cells(cfg)
    primary = [c for c in cells if c.role == "primary"]
    matched = [c for c in cells if c.arm == "matched_mean"]
    scaled = [c for c in cells if c.arm == "sum_scaled"]
    assert len(primary) == 29 and len(matched) == 29 and len(cells) == 66  # 12 settings + 17 replicates each
    # the scale/weighting arm: raw alone, replicated as the other arms (3 seeds at 0.01 and 0.1, 2 at 1)
    assert len(scaled) == 8 and {c.settings["reconstruction_family"] for c in scaled} == {"raw"}
    assert {c.settings["token_aggregation"] for c in scaled} == {"sum_scaled"}
    assert sorted(str(strip) for strip in (c.settings.replace(token_aggregation="sum") for c in scaled)) == sorted(
        str(c.settings) for c in primary if c.settings["reconstruction_family"] == "raw"
    )
    per_setting = {}
    for c in primary:
        key = (c.settings["reconstruction_family"], c.settings["beta"])
        per_setting[key] = per_setting.get(key, 0) + 1
    assert {k: n for k, n in per_setting.items() if n == 3} == {
        ("raw", 0.01): 3,
        **{(f, 0.1): 3 for f in ("raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95")},
    }
    assert sorted(per_setting.values()) == [2] * 7 + [3] * 5  # every KL weight replicated
    assert {c.settings["token_aggregation"] for c in primary} == {"sum"}
    assert {c.settings["token_aggregation"] for c in matched} == {"mean"}
    # the arms differ in token aggregation alone: the same settings, schedule and seeds
    strip = lambda c: {k: v for k, v in c.settings.items() if k != "token_aggregation"}  # noqa: E731
    assert sorted(map(str, map(strip, primary))) == sorted(map(str, map(strip, matched)))
    assert {c.settings["beta_schedule"] for c in cells} == {"lin300"}  # a KL warm-up in both arms
    replicated = [c for c in primary if c.settings["seed"] != 314159]
    assert {c.settings["seed"] for c in replicated} == {314160, 314161}
    assert {c.settings["beta"] for c in replicated} == {0.01, 0.1, 1.0} and len(replicated) == 17
    assert "agg-sum_fam-raw_beta-0.01_sched-lin300_seed-314159" in {c.cell_id for c in primary}
    assert "agg-mean_fam-dist_norm_beta-1_sched-lin300_seed-314159" in {c.cell_id for c in matched}
    # the endpoint and the contrast are declared in the config
    assert cfg["report"]["primary_metric"] == "router_information"
    assert cfg["report"]["primary_contrast"] == "matched_mean"


def test_the_original_studys_contrast_is_one_config_away():
    cfg = C.load_config(ROOT / "config" / "study001.yaml")
    cells = K.expand_cells(cfg)
    ref = [c for c in cells if c.arm == "mean_lin100"]
    assert {c.settings["beta_schedule"] for c in ref} == {"lin100"} and {c.settings["beta"] for c in ref} == {0.01, 0.1}
    assert "agg-mean_fam-dist_norm_beta-0.1_sched-lin100_seed-314159" in {c.cell_id for c in ref}
    assert cfg["report"]["primary_contrast"] == "mean_lin100"
    # its sum cells are the study's constant-beta ones: the default collection's settings, budget
    # and seeds without the warm-up
    primary = [c for c in cells if c.role == "primary"]
    assert {c.settings["beta_schedule"] for c in primary} == {"constant"}
    default = {c.cell_id for c in K.expand_cells(default_cfg()) if c.role == "primary"}
    assert {c.cell_id for c in primary} == {i.replace("_sched-lin300", "") for i in default}
    assert cfg["train"] == default_cfg()["train"]


def test_an_arm_keeps_its_own_seed_an_aa_arm():
    """An A/A arm: the primary arm's settings with another seed. Its seed is honoured (the
    collection's seeds used to replace it, and the two arms then collided)."""
    cfg = C.check_config(
        minimal(comparison_arms=[{"name": "aa", "settings": {"token_aggregation": "sum", "seed": 271828}}])
    )
    cells = K.expand_cells(cfg)
    assert [c.cell_id for c in cells] == [
        "agg-sum_fam-raw_beta-0.1_seed-314159",
        "agg-sum_fam-raw_beta-0.1_seed-271828",
    ]
    cfg = C.check_config(minimal(seeds=[1, 2], comparison_arms=[{"name": "aa", "seeds": [3, 4]}]))
    assert [(c.arm, c.settings["seed"]) for c in K.expand_cells(cfg)] == [
        ("primary", 1),
        ("primary", 2),
        ("aa", 3),
        ("aa", 4),
    ]
    with pytest.raises(C.ConfigError, match=r"comparison_arms\[0\]: give the arm's seeds once"):
        C.check_config(minimal(comparison_arms=[{"name": "aa", "seeds": [3], "settings": {"seed": 4}}]))
    with pytest.raises(C.ConfigError, match="appears in two arms"):  # the same seed: the same cells
        C.check_config(minimal(comparison_arms=[{"name": "aa", "seeds": [314159]}]))


def test_replicates_add_the_next_seeds_to_the_chosen_settings_of_every_arm():
    cfg = C.check_config(
        minimal(
            grid={"reconstruction_family": ["raw", "dist_norm"], "beta": [0.01, 0.1]},
            comparison_arms=[
                {"name": "mean", "settings": {"token_aggregation": "mean"}},
                {"name": "aa", "seeds": [7]},
            ],
            replicates={"extra_seeds": 2, "grid": {"beta": [0.01]}},
        )
    )
    cells = K.expand_cells(cfg)
    seeds = {}
    for c in cells:
        key = (c.arm, c.settings["reconstruction_family"], c.settings["beta"])
        seeds.setdefault(key, []).append(c.settings["seed"])
    assert seeds[("primary", "raw", 0.01)] == [314159, 314160, 314161]
    assert seeds[("primary", "raw", 0.1)] == [314159]
    assert seeds[("mean", "dist_norm", 0.01)] == [314159, 314160, 314161]
    assert seeds[("aa", "raw", 0.01)] == [7, 8, 9] and seeds[("aa", "dist_norm", 0.1)] == [7]
    assert len(cells) == 3 * (2 * 3 + 2)
    # no grid: every setting; 0 extra seeds: none
    assert len(K.expand_cells(C.check_config(minimal(replicates={})))) == 2
    assert len(K.expand_cells(C.check_config(minimal(replicates={"extra_seeds": 0})))) == 1


def test_replicate_groups_give_each_setting_the_most_extra_seeds_of_the_groups_it_is_in():
    """A list of groups: beta 0.01 gets one extra seed, beta 0.1 two, and raw at 0.01 two (the
    larger of its two groups); beta 1 none."""
    cfg = C.check_config(
        minimal(
            grid={"reconstruction_family": ["raw", "dist_norm"], "beta": [0.01, 0.1, 1]},
            comparison_arms=[{"name": "mean", "settings": {"token_aggregation": "mean"}}],
            replicates=[
                {"extra_seeds": 1, "grid": {"beta": [0.01]}},
                {"extra_seeds": 2, "grid": {"beta": [0.1]}},
                {"extra_seeds": 2, "grid": {"beta": [0.01], "reconstruction_family": ["raw"]}},
            ],
        )
    )
    seeds = {}
    for c in K.expand_cells(cfg):
        seeds.setdefault((c.arm, c.settings["reconstruction_family"], c.settings["beta"]), []).append(
            c.settings["seed"]
        )
    for arm in ("primary", "mean"):
        assert seeds[(arm, "raw", 0.01)] == [314159, 314160, 314161]
        assert seeds[(arm, "dist_norm", 0.01)] == [314159, 314160]
        assert seeds[(arm, "raw", 0.1)] == seeds[(arm, "dist_norm", 0.1)] == [314159, 314160, 314161]
        assert seeds[(arm, "raw", 1.0)] == [314159]
    with pytest.raises(C.ConfigError, match="replicates"):
        C.check_config(minimal(replicates=[{"extra_seeds": 1, "grid": {"beta": [0.01]}, "seeds": 3}]))


def test_primary_contrast_must_name_a_comparison_arm():
    with pytest.raises(C.ConfigError, match="report.primary_contrast: 'nope' is not a comparison arm"):
        C.check_config(minimal(report={"primary_contrast": "nope"}))


def test_cell_id_beta_one_and_one_point_zero_are_the_same():
    cfg = minimal(grid={"reconstruction_family": ["raw"], "beta": [1, 1.0, 0.010]})
    ids = [c.cell_id for c in K.expand_cells(C.check_config(cfg))]
    assert ids == ["agg-sum_fam-raw_beta-1_seed-314159", "agg-sum_fam-raw_beta-0.01_seed-314159"]


def test_cell_id_names_non_default_settings_and_round_trips():
    s = {
        **K.schema_cell_defaults(),
        "token_aggregation": "sum_scaled",
        "reconstruction_family": "dist_tokcc_0.05_0.95",
        "beta": 0.1,
        "latent_dim": 8,
        "seed": 3,
    }
    cid = K.cell_id(K.normalize_settings(s))
    assert cid == "agg-sum_scaled_fam-dist_tokcc_0.05_0.95_beta-0.1_zdim-8_seed-3"
    back = K.parse_cell_id(cid)
    assert back == {
        "token_aggregation": "sum_scaled",
        "reconstruction_family": "dist_tokcc_0.05_0.95",
        "beta": "0.1",
        "latent_dim": "8",
        "seed": "3",
    }


def test_grid_with_four_axes_and_seeds_expands_to_product():
    cfg = minimal(
        grid={"reconstruction_family": ["raw", "dist_norm"], "beta": [0.01, 0.1], "token_aggregation": ["mean", "sum"]},
        seeds=[1, 2],
    )
    cells = K.expand_cells(C.check_config(cfg))
    assert len(cells) == 16 and len({c.cell_id for c in cells}) == 16


def test_comparison_arm_inherits_primary_axes_it_does_not_override():
    cfg = minimal(
        grid={"reconstruction_family": ["raw", "dist_norm"], "beta": [0.01, 0.1, 1]},
        comparison_arms=[{"name": "matched", "settings": {"token_aggregation": "mean"}}],
    )
    cells = K.expand_cells(C.check_config(cfg))
    assert len([c for c in cells if c.arm == "matched"]) == 6


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["grid"].update(reconstruction_family=["raw", "bogus"]), "grid.reconstruction_family[1]"),
        (lambda c: c["grid"].update(beta=[-0.1]), "grid.beta[0]"),
        (lambda c: c["grid"].update(beta=[]), "grid.beta"),
        (lambda c: c.update(gird={}), "gird"),
        (lambda c: c["data"].update(train_per_task=0), "data.train_per_task"),
        (lambda c: c["data"].update(tasks=["sorting_algorithms", "no_such_task"]), "data.tasks[1]"),
        (lambda c: c.update(train={"stpes": 3}), "train.stpes"),
        (lambda c: c.update(cell={"beta_schedule": "linear"}), "cell.beta_schedule"),
        (lambda c: c.update(comparison_arms=[{"name": "x"}]), "comparison_arms[0]"),
    ],
)
def test_bad_config_names_the_key(mutate, key):
    cfg = minimal()
    mutate(cfg)
    with pytest.raises(C.ConfigError) as e:
        C.check_config(cfg)
    assert key in str(e.value), str(e.value)


def test_defaults_filled_and_input_not_mutated():
    raw = minimal()
    before = copy.deepcopy(raw)
    cfg = C.check_config(raw)
    assert raw == before
    assert cfg["train"]["eval_every"] == 25 and cfg["cell"]["latent_dim"] == 64
    assert cfg["backbone"]["embedded"]["num_hidden_layers"] >= 1


def test_beta_labels():
    assert K.beta_label(0.01) == "beta=.01" and K.beta_label(1.0) == "beta=1"


def test_all_shipped_configs_validate():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        cfg = C.load_config(path)
        assert K.expand_cells(cfg), path


def test_followup_extends_default_and_adds_matched_and_scaled_arms():
    cfg = C.load_config(ROOT / "config" / "followup.yaml")
    default = default_cfg()
    assert C.Base.of(cfg).settings() == C.Base.of(default).settings() and cfg["base"] == default["base"]
    cells = K.expand_cells(C.check_config(cfg))
    by_arm = {}
    for c in cells:
        by_arm.setdefault(c.arm, []).append(c)
    # sum_scaled for raw only (it equals sum for the normalized families); + the default's replicates
    # (a second seed at beta 0.01 and 0.1, a third at 0.1 and for raw at 0.01)
    assert {a: len(v) for a, v in by_arm.items()} == {"sum": 29, "matched_mean": 29, "sum_scaled": 8, "mean_lin100": 21}
    assert {c.settings["beta_schedule"] for c in by_arm["matched_mean"]} == {"lin300"}
    # the default collection's cells are all in it (reused on the same base)
    assert {c.cell_id for c in K.expand_cells(default)} <= {c.cell_id for c in cells}
    # the matched arm differs from the primary arm in token aggregation alone
    prim = {
        (c.settings["reconstruction_family"], c.settings["beta"], c.settings["seed"]): c.settings for c in by_arm["sum"]
    }
    for c in by_arm["matched_mean"]:
        p = prim[(c.settings["reconstruction_family"], c.settings["beta"], c.settings["seed"])]
        assert {k for k in p if p[k] != c.settings[k]} == {"token_aggregation"}


def test_aa_collection_is_sum_against_itself_on_the_default_base_with_its_own_seeds():
    """config/aa.yaml: the primary arm `sum` against an arm `aa` with the same settings and other
    replicate seeds, 4 families x betas 0.01, 0.1, replicated as the default collection is (three
    seeds at beta 0.1 and for raw at 0.01, two at the other beta 0.01 settings) in both arms."""
    cfg = C.load_config(ROOT / "config" / "aa.yaml")
    default = default_cfg()
    assert (
        C.Base.of(cfg).settings() == C.Base.of(default).settings()
        and cfg["base"] == default["base"] == "embedded-6task-v7"
    )
    assert cfg["report"]["primary_contrast"] == "aa" and cfg["train"] == default["train"]
    cells = K.expand_cells(cfg)
    by_arm = {}
    for c in cells:
        by_arm.setdefault(c.arm, []).append(c)
    assert {a: len(v) for a, v in by_arm.items()} == {"sum": 21, "aa": 21}
    assert {c.settings["seed"] for c in by_arm["sum"]} == {314159, 314160, 314161}
    assert {c.settings["seed"] for c in by_arm["aa"]} == {271828, 271829, 271830}
    strip = lambda c: {k: v for k, v in c.settings.items() if k != "seed"}  # noqa: E731
    # the same settings in both arms, token aggregation included: the arms differ in seeds alone
    assert sorted(map(str, map(strip, by_arm["sum"]))) == sorted(map(str, map(strip, by_arm["aa"])))
    assert {c.settings["token_aggregation"] for c in cells} == {"sum"}
    assert {(c.settings["reconstruction_family"], c.settings["beta"]) for c in cells} == {
        (f, b) for f in ("raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95") for b in (0.01, 0.1)
    }
    # the primary arm's cells are the default collection's (reused on the same base)
    assert {c.cell_id for c in by_arm["sum"]} <= {c.cell_id for c in K.expand_cells(default)}
    # every cell its own training seed: no two cells of the A/A collection share their luck
    assert len({K.training_seed(c.settings) for c in cells}) == len(cells)


def test_extends_missing_parent_names_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("extends: config/nope.yaml\ncollection: x\n")
    with pytest.raises(C.ConfigError, match="extends"):
        C.load_config(p)


def test_extends_resolves_relative_to_the_extending_file(tmp_path, monkeypatch):
    """A second checkout's configs extend their own siblings, whatever the working directory and
    wherever the package is installed."""
    other = tmp_path / "checkout2" / "config"
    other.mkdir(parents=True)
    (other / "config.yaml").write_text(
        (ROOT / "config" / "smoke.yaml").read_text().replace("collection: smoke", "collection: theirs")
    )
    (other / "followup.yaml").write_text("extends: config.yaml\nbase: theirs-base\n")
    monkeypatch.chdir(tmp_path)
    cfg = C.load_config(other / "followup.yaml")
    assert cfg["collection"] == "theirs" and cfg["base"] == "theirs-base"
    # a config given as a dict (as Snakemake hands it over) with the folder it came from
    cfg = C.load_config(cfg={"extends": "config.yaml", "base": "b2"}, here=other)
    assert cfg["collection"] == "theirs"
    with pytest.raises(C.ConfigError, match="extends"):
        C.load_config(cfg={"extends": "config.yaml"})  # the working directory has no config.yaml


def test_base_guard_names_the_changed_keys_and_ignores_how_the_model_is_obtained_and_run():
    cfg = C.load_config(ROOT / "config" / "config.yaml")
    stored = json.loads(json.dumps(C.Base.of(cfg).settings(), default=str))
    assert C.base_guard(stored, C.Base.of(cfg)) is None
    # how the entangled model is obtained (trained, shipped) and run (attention) are not the base
    other = {
        **cfg,
        "entangle": {**cfg["entangle"], "mode": "train"},
        "backbone": {**cfg["backbone"], "attn_implementation": "eager"},
    }
    assert C.base_guard(stored, C.Base.of(other)) is None
    why = C.base_guard({**stored, "entangle": {**stored["entangle"], "steps": 5}}, C.Base.of(cfg))
    assert "entangle.steps" in why and cfg["base"] in why
    why = C.base_guard(
        {**stored, "data": {**stored["data"], "seed": 1}, "tokenizer": "pretrained:x@default"}, C.Base.of(cfg)
    )
    assert "data.seed" in why and "tokenizer" in why and "entangle.steps" not in why


def test_config_reference_is_generated_from_the_schema_and_describes_every_key():
    """docs/config.md is `python -m latentstrat.schema` (regenerate it after a schema edit), and every
    key has a description."""
    from latentstrat.schema import reference_markdown, undescribed_keys

    root = Path(__file__).resolve().parents[1]
    assert (root / "docs" / "config.md").read_text() == reference_markdown(), "regenerate docs/config.md"
    assert undescribed_keys() == []
    text = reference_markdown()
    for key in ("`lora.r`", "`probes.information_repeats`", "`report.primary_contrast`", "`token_aggregation`"):
        assert key in text


@pytest.mark.parametrize("name", ["config", "aa", "qwen25-05b", "followup", "followup-3seeds", "study001", "quick-aa"])
def test_every_setting_of_a_headline_has_its_own_replicates(name):
    """Every setting of the headline's two arms trains at least two seeds, so every stratum of
    the interval (a KL weight and a state) measures its own training noise; the quick collection,
    which declares no headline contrast, is the one config without."""
    from collections import Counter

    from latentstrat.cells import expand_cells

    cfg = C.config_for_command(ROOT / "config" / f"{name}.yaml")
    arms = {cfg["primary_arm"], cfg["report"]["primary_contrast"]}
    seeds = Counter(
        (c.arm, c.settings["reconstruction_family"], c.settings["beta"]) for c in expand_cells(cfg) if c.arm in arms
    )
    assert len({a for a, _, _ in seeds}) == 2 and min(seeds.values()) >= 2, {k: v for k, v in seeds.items() if v < 2}


def test_a_replicate_group_that_matches_no_cell_is_an_error_naming_it():
    """A typo in a replicate group's grid (beta 0.001) adds no seed; the verdict would silently
    read `training noise unknown`. It is a config error naming the group and its values."""
    raw = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    bad = {
        **raw,
        "replicates": [{"extra_seeds": 1, "grid": {"beta": [0.01]}}, {"extra_seeds": 1, "grid": {"beta": [0.001]}}],
    }
    with pytest.raises(C.ConfigError, match=r"replicates\[1\]\.grid: no cell has beta: \[0\.001\]"):
        C.check_config(bad)
    C.check_config({**raw, "replicates": [{"extra_seeds": 1, "grid": {"beta": [0.01]}}]})  # control


def test_the_primary_metric_is_one_the_arms_are_compared_on():
    raw = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    from latentstrat.metrics import CONTRAST_METRICS, ENDPOINT

    with pytest.raises(C.ConfigError, match=r"report.primary_metric: 'router_informaton' is not one of \['router_inf"):
        C.check_config({**raw, "report": {"primary_metric": "router_informaton"}})
    # the default and the choices come from the metric registry (metrics.ENDPOINT, CONTRAST_METRICS)
    assert C.check_config(raw)["report"]["primary_metric"] == ENDPOINT
    from latentstrat.schema import load_schema

    assert load_schema()["properties"]["report"]["properties"]["primary_metric"]["enum"] == list(CONTRAST_METRICS)
    assert C.check_config({**raw, "report": {"primary_metric": "matched_router_score"}})["report"]["primary_metric"]
