"""The headline qualified: a verdict that rests on a cell failing the sanity check reads `cannot
tell`; the family that carries a verdict is named (with the raw-under-mean reason); the sign-flip
test's disagreement is said."""

import dataclasses

import pandas as pd

from latentstrat import families as F
from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.report.headline import headline, headline_md


def tables(verdict="positive", failing=(), without_raw="cannot tell", sign_flip_p=0.01, n_settings=12, unchecked=()):
    contrast = {
        "comparison_arm": "matched_mean",
        "metric": "router_information",
        "n_cells": n_settings,
        "mean_delta": 0.3,
        "ci_low": 0.1 if verdict == "positive" else -0.1,
        "ci_high": 0.5,
        "verdict": verdict,
        "why": "",
        "detectable_delta": 0.2,
        "training_noise_in_interval": True,
        "seeds_min": 2,
        "seeds_max": 2,
        "sign_flip_p": sign_flip_p,
        "interval_df": 4.0,
        "training_noise_strata": "used: 2 settings, 2 df",
    }
    fam = []
    for f, only, without in (("raw", "positive", without_raw), ("dist_norm", "cannot tell", "positive")):
        fam.append(
            {
                "comparison_arm": "matched_mean",
                "metric": "router_information",
                FAMILY_COL: f,
                "part": "only",
                "mean_delta": 0.5,
                "ci_low": 0.2,
                "ci_high": 0.8,
                "verdict": only,
            }
        )
        fam.append(
            {
                "comparison_arm": "matched_mean",
                "metric": "router_information",
                FAMILY_COL: f,
                "part": "without",
                "mean_delta": 0.02,
                "ci_low": -0.1,
                "ci_high": 0.14,
                "verdict": without,
            }
        )
    cells = ["p1", "p2", "c1", "c2"]
    return {
        "arm_contrasts": pd.DataFrame([contrast]),
        "contrast_by_family": pd.DataFrame(fam),
        "common_cells": pd.DataFrame(
            {"comparison_arm": ["matched_mean"] * 2, "primary_cell": ["p1", "p2"], "comparison_cell": ["c1", "c2"]}
        ),
        "cell_sanity": pd.DataFrame(
            {
                "cell_id": cells,
                "passed": [None if c in unchecked else c not in failing for c in cells],
                "step0_base_relative_reconstruction": [1.0] * len(cells),
            }
        ),
        "collection_state": pd.DataFrame({"arm": ["sum"], "role": ["primary"]}),
        "summary_by_setting": pd.DataFrame({"arm": ["sum", "matched_mean"], "token_aggregation": ["sum", "mean"]}),
        "summary": pd.DataFrame({"reconstruction_family": ["raw", "dist_norm"]}),
    }


META = {"primary_metric": "router_information", "report": {"primary_contrast": "matched_mean"}}


def test_a_verdict_over_a_failing_cell_reads_cannot_tell():
    h = headline(tables(failing=("c2",)), META)
    assert h["verdict"] == "cannot tell" and h["verdict_before_sanity"] == "positive"
    assert h["headline_failing_cells"] == ["c2"] and "c2" in h["why"]
    text = "\n".join(headline_md(tables(failing=("c2",)), META, h))
    assert "**Cell sanity**" in text and "reads positive" in text
    # control: every cell passes, the interval's verdict stands
    ok = headline(tables(), META)
    assert ok["verdict"] == "positive" and "verdict_before_sanity" not in ok and ok["headline_failing_cells"] == []
    # a cell whose checks did not all run does not pass either
    missing = headline(tables(unchecked=("p1",)), META)
    assert missing["verdict"] == "cannot tell" and missing["headline_unchecked_cells"] == ["p1"]
    assert "1 cell whose sanity checks did not all run (p1)" in missing["why"]


def test_the_family_that_carries_the_verdict_is_named_with_its_reason(monkeypatch):
    h = headline(tables(), META)
    assert h["carried_by"] == ["raw"]  # without raw: cannot tell; without dist_norm: still positive
    assert h["by_family"]["raw"]["only"]["verdict"] == "positive"
    text = "\n".join(headline_md(tables(), META, h))
    assert "carried by **raw**" in text and "n_bar" in text
    # the reason reads the family's declaration (`normalized`), not its name: declared normalized,
    # the same family carries the verdict without the n_bar reason
    monkeypatch.setitem(F.KINDS, "raw", dataclasses.replace(F.KINDS["raw"], normalized=True))
    assert "n_bar" not in "\n".join(headline_md(tables(), META, headline(tables(), META)))
    assert headline(tables(without_raw="positive"), META)["carried_by"] == []
    # leaving raw out leaves no measured training noise: that is no evidence that raw carries it
    t = tables()
    f = t["contrast_by_family"]
    f.loc[(f[FAMILY_COL] == "raw") & (f.part == "without"), "why"] = "training noise unknown for 1 of 1 settings"
    assert headline(t, META)["carried_by"] == []


def test_the_sign_flip_test_is_a_diagnostic_outside_the_verdict():
    """The randomization test is reported at the look's level in its own labelled section, and
    neither confirms nor overturns the verdict: the headline reads the same whatever its p."""
    from latentstrat.report.headline import randomization_md

    below, above = headline(tables(sign_flip_p=0.01), META), headline(tables(sign_flip_p=0.2), META)
    assert below["verdict"] == above["verdict"] == "positive" and below["why"] == above["why"]
    assert below["randomization"]["below"] is True and above["randomization"]["below"] is False
    assert "randomization_agrees" not in below
    text = "\n".join(randomization_md(above))
    assert "## Randomization Diagnostic" in text and "not part of the verdict" in text
    assert f"not below the look's level {above['alpha']:g}" in text
    assert "Randomization" not in "\n".join(headline_md(tables(sign_flip_p=0.2), META, above))


def test_a_sign_flip_test_that_cannot_reach_the_level_says_nothing_at_it():
    """Over 4 settings the smallest two-sided p is 2/16 = 0.125: below the level is impossible."""
    from latentstrat.report.headline import randomization_md

    h = headline(tables(sign_flip_p=0.875, n_settings=4), META)
    assert h["randomization"]["below"] is None
    assert "cannot go below 0.125" in "\n".join(randomization_md(h))
    # six settings can reach it (2/64): the control
    assert headline(tables(sign_flip_p=0.875, n_settings=6), META)["randomization"]["below"] is False


HOST = {
    "train_cpu": "AMD EPYC",
    "train_cpu_capability": "AVX-512 + native bf16",
    "train_device": "cpu",
    "train_torch_version": "2.13.0",
    "train_code_hash": "a3bb973b9b7bc56a",
    **{
        f"{stage}_{k}": v
        for stage in ("evaluate", "probes")
        for k, v in (("cpu", "AMD EPYC"), ("code_hash", "a3bb973b9b7bc56a"))
    },
}


def test_a_pair_is_on_one_host_only_with_one_cpu_model_and_one_code_in_every_stage():
    """The pair check compares the CPU model (an AMD EPYC and an Intel Xeon both read AVX-512 +
    native bf16), the code's content hash, every machine a resumed cell trained on, and where it
    was evaluated and probed; a field either cell did not record is unknown, never a pass."""
    import json

    from latentstrat.aggregate.hosts import pair_host_check

    def check(**b):
        cells = {"p1": {"seed": 1, **HOST}, "c1": {"seed": 1, **HOST, **b}}
        return pair_host_check(pd.Series({"cell_ids": "p1"}), pd.Series({"cell_ids": "c1"}), cells)

    assert check() == ("", "")  # control: one host
    assert check(train_cpu="Intel Xeon") == ("seed 1: train CPU AMD EPYC vs Intel Xeon", "")
    assert check(train_code_hash="0000000000000000")[0] == "seed 1: train code a3bb973b9b7bc56a vs 0000000000000000"
    assert check(probes_cpu="Intel Xeon")[0] == "seed 1: probes CPU AMD EPYC vs Intel Xeon"
    assert check(evaluate_code_hash="ffff")[0] == "seed 1: evaluate code a3bb973b9b7bc56a vs ffff"
    assert check(train_cpu=None) == ("", "seed 1: train CPU of c1 not recorded")
    assert check(evaluate_cpu=float("nan")) == ("", "seed 1: evaluate CPU of c1 not recorded")
    # a resumed cell: its host segments, not the last host's columns
    seg = {k[len("train_") :]: v for k, v in HOST.items() if k.startswith("train_")}
    moved = json.dumps([{**seg, "from_step": 0}, {**seg, "cpu": "Intel Xeon", "from_step": 150}])
    assert check(train_hosts=moved)[0] == "seed 1: c1 moved while training (CPU AMD EPYC then Intel Xeon)"
    stayed = json.dumps([{**seg, "from_step": 0}])
    assert check(train_hosts=stayed, train_cpu="ignored: the segments are the record") == ("", "")
    # nothing to compare at all: every pair unknown
    assert pair_host_check(pd.Series({"cell_ids": "p1"}), pd.Series({"cell_ids": "c1"}), None)[1]


def test_a_pair_that_mixes_hosts_makes_the_headline_cannot_tell():
    """The two cells of a pair on machines of another CPU capability (or device, torch or code)
    do not cancel what the machine does: the headline reads cannot tell (pair mixes hosts) and
    names the setting, as it does for a pair whose host is unknown, unless the config declares
    such pairs acceptable; pairs by seed, and by replicate order for an arm with seeds of its own."""
    from latentstrat.aggregate.columns import FAMILY_COL
    from latentstrat.aggregate.hosts import pair_host_check

    cells = {
        "p1": {"seed": 1, **HOST},
        "p2": {"seed": 2, **HOST},
        "c1": {"seed": 1, **HOST},
        "c2": {"seed": 2, **HOST, "train_cpu_capability": "AVX2, no native bf16"},
        "a7": {"seed": 7, **HOST},
        "a8": {"seed": 8, **HOST, "train_torch_version": "2.12.0"},
    }
    p = pd.Series({"cell_ids": "p1,p2"})
    assert pair_host_check(p, pd.Series({"cell_ids": "c1,c2"}), cells)[0] == (
        "seed 2: train CPU capability AVX-512 + native bf16 vs AVX2, no native bf16"
    )
    assert pair_host_check(p, pd.Series({"cell_ids": "c1"}), cells) == ("", "")  # seed 1 pairs on one host
    assert pair_host_check(p, pd.Series({"cell_ids": "a8,a7"}), cells)[0] == "seed 2: train torch 2.13.0 vs 2.12.0"
    t = tables()
    t["common_cells"] = t["common_cells"].assign(
        **{
            FAMILY_COL: ["raw", "tokcc"],
            "beta_label": ["beta=.01", "beta=.1"],
            "pair_host_mix": ["", "seed 2: x"],
            "pair_host_unknown": ["", ""],
        }
    )
    h = headline(t, META)
    assert h["verdict"] == "cannot tell" and h["verdict_before_host_check"] == "positive"
    assert "pair mixes hosts" in h["why"] and "tokcc beta=.1: seed 2: x" in h["why"]
    allowed = headline(t, {**META, "report": {**META["report"], "allow_mixed_host_pairs": True}})
    assert allowed["verdict"] == "positive" and allowed["pairs_mixing_hosts"] == ["tokcc beta=.1: seed 2: x"]
    t["common_cells"] = t["common_cells"].assign(
        pair_host_mix="", pair_host_unknown=["seed 1: train CPU of c1 not recorded", ""]
    )
    h = headline(t, META)
    assert h["verdict"] == "cannot tell" and "pair host unknown: 1 setting" in h["why"]
    assert h["pairs_with_unknown_hosts"] == ["raw beta=.01: seed 1: train CPU of c1 not recorded"]
    assert headline(tables(), META)["verdict"] == "positive"  # control: one host


def test_the_secondary_endpoint_says_whether_raw_decides_the_verdict():
    """Beside the full contrast (positive), the normalized families' contrast: cannot tell there
    means `raw` decides the verdict, said in brief and text; the same reading means it does not."""

    def with_normalized(verdict):
        t = tables()
        t["normalized_contrasts"] = pd.DataFrame(
            [
                {
                    "comparison_arm": "matched_mean",
                    "metric": "router_information",
                    "n_cells": 9,
                    "mean_delta": -0.019,
                    "ci_low": -0.10,
                    "ci_high": 0.06,
                    "verdict": verdict,
                    "why": "",
                }
            ]
        )
        return t

    t = with_normalized("cannot tell")
    h = headline(t, META)
    assert h["verdict"] == "positive" and h["normalized_families"]["raw_decides"] is True
    text = "\n".join(headline_md(t, META, h))
    assert "over the 9 settings of the normalized families alone" in text and "`raw`" in text
    assert "decides the verdict (positive with it, cannot tell without)" in text
    same = headline(with_normalized("positive"), META)
    assert same["normalized_families"]["raw_decides"] is False
    assert headline(tables(), META)["normalized_families"] is None  # not computed: nothing said
