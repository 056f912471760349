"""The declared split of the primary contrast (report.contrast_split, aggregate.split): on the
settings all three arms share, sum - mean = scale (sum - sum_scaled) + weighting (sum_scaled -
mean) exactly, each part with its own interval at the look's level over the number of parts; a
split that does not chain from the primary arm to the primary contrast is a config error."""

import numpy as np
import pytest

from latentstrat.aggregate.collection import CollectionData, report_settings, verdict_tables
from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.bench import calibrate
from latentstrat.cells import expand_cells
from latentstrat.config import ConfigError, load_config


@pytest.fixture(scope="module")
def default_cfg():
    return load_config("config/config.yaml")


def _tables(cfg, shift: float, seed: int = 0):
    d = calibrate.design(expand_cells(cfg))
    summary, boot = calibrate.draw(d, calibrate.SCENARIOS["independent"], np.random.default_rng(seed), shift=shift)
    settings = report_settings(cfg["report"])
    t, _ = verdict_tables(CollectionData(summary, None, {}, ["reconstruction_family", "beta"], None, boot), settings)
    return t, settings, summary


def test_the_parts_add_up_to_the_primary_contrast_on_raw(default_cfg):
    t, settings, summary = _tables(default_cfg, shift=0.0)
    s = t["contrast_split"].set_index("part")
    assert list(s.index) == ["scale", "weighting", "total"]
    assert (s.n_cells == 3).all() and set(s.settings) == {"raw beta=.01, raw beta=.1, raw beta=1"}
    assert s.loc["total", "mean_delta"] == pytest.approx(
        s.loc["scale", "mean_delta"] + s.loc["weighting", "mean_delta"]
    )
    # the total is the headline's contrast restricted to raw: the mean of raw's per-setting deltas
    raw = t["common_cells"]
    raw = raw[(raw.comparison_arm == "matched_mean") & (raw[FAMILY_COL] == "raw")]
    assert s.loc["total", "mean_delta"] == pytest.approx(raw.delta_router_information.mean())
    # each part at the first look's level over the two parts (Bonferroni), its interval around it
    assert list(s.alpha) == pytest.approx([settings["alpha_by_look"][0] / 2] * 3)
    assert (s.ci_low < s.mean_delta).all() and (s.mean_delta < s.ci_high).all()
    assert s.training_noise_in_interval.all()  # raw is replicated in every arm


def test_a_shift_of_sum_alone_is_scale_not_weighting(default_cfg):
    """Positive control: moving only the sum cells by +0.5 moves scale and the total by +0.5,
    weighting (sum_scaled - mean) not at all."""
    base, _, _ = _tables(default_cfg, shift=0.0, seed=4)
    moved, _, _ = _tables(default_cfg, shift=0.5, seed=4)
    b, m = base["contrast_split"].set_index("part"), moved["contrast_split"].set_index("part")
    assert m.loc["scale", "mean_delta"] - b.loc["scale", "mean_delta"] == pytest.approx(0.5)
    assert m.loc["total", "mean_delta"] - b.loc["total", "mean_delta"] == pytest.approx(0.5)
    assert m.loc["weighting", "mean_delta"] == pytest.approx(b.loc["weighting", "mean_delta"])
    assert m.loc["scale", "verdict"] == "positive"


@pytest.mark.parametrize(
    "split, culprit",
    [
        ([{"name": "scale", "arms": ["sum", "nope"]}], "'nope' is not an arm"),
        (
            [{"name": "a", "arms": ["sum", "sum_scaled"]}, {"name": "b", "arms": ["sum", "matched_mean"]}],
            "must run from",
        ),
        ([{"name": "a", "arms": ["sum_scaled", "matched_mean"]}], "must run from"),
        (
            [{"name": "a", "arms": ["sum", "sum_scaled"]}, {"name": "a", "arms": ["sum_scaled", "matched_mean"]}],
            "repeat",
        ),
    ],
)
def test_a_split_that_does_not_chain_is_a_config_error(default_cfg, split, culprit):
    with pytest.raises(ConfigError, match="report.contrast_split") as e:
        load_config("config/config.yaml", overrides={"report": {"contrast_split": split}})
    assert culprit in str(e.value)


def test_the_report_says_which_verdicts_are_confirmatory_and_counts_the_rest(default_cfg):
    """Multiplicity said: the headline is confirmatory, the split (Bonferroni over its 2 parts)
    declared but secondary;
    the default collection's other verdicts are counted and labelled exploratory: 2 arms x 4
    metrics less the headline's (7), 4 families x (alone, without) + raw against sum_scaled (9),
    15 common settings x 4 metrics (60), the normalized families' secondary (1)."""
    from latentstrat.report.headline import headline
    from latentstrat.report.landing import landing_html
    from latentstrat.report.multiplicity import multiplicity, multiplicity_md
    from latentstrat.report.split import split_parts

    t, _, _ = _tables(default_cfg, shift=0.0)
    h = headline(t, {**default_cfg, "primary_metric": "router_information", "primary_arm": "sum"})
    m = multiplicity(t, h, [p for p in split_parts(t) if p["part"] != "total"])
    assert m["confirmatory"] == ["headline"]
    assert m["declared_secondary"] == ["contrast split (2 parts, Bonferroni within)"]
    assert m["exploratory_by_kind"] == {
        "other metrics and arms": 7,
        "per-family contrasts": 9,
        "per-setting verdicts": 60,
        "normalized families' secondary": 1,
    }
    assert m["exploratory"] == 77
    text = "".join(multiplicity_md(m))
    assert "**exploratory (unadjusted)**" in text and "the 77 other verdicts" in text
    page = landing_html({**h, "multiplicity": m}, t, {}, {}, None)
    assert "77 other verdicts in the report are exploratory (unadjusted)" in page
