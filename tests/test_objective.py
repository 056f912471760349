"""Objective on hand-computed toy tensors."""

import math

import pytest
import torch

from latentstrat.families import parse_family
from latentstrat.modeling import objective as obj

L = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
M = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregations_hand_computed():
    assert obj.aggregate_tokens(L, M, "mean").tolist() == [2.0, 4.0]
    assert obj.aggregate_tokens(L, M, "sum").tolist() == [6.0, 4.0]
    assert obj.aggregate_tokens(L, M, "sum_scaled", n_bar=2.0).tolist() == [3.0, 2.0]
    # sum = mean x n_i
    n = M.sum(1).float()
    assert torch.allclose(obj.aggregate_tokens(L, M, "sum"), obj.aggregate_tokens(L, M, "mean") * n)
    # padded values never count
    assert obj.aggregate_tokens(L + 100 * (1 - M), M, "sum").tolist() == [6.0, 4.0]
    with pytest.raises(ValueError, match="median"):
        obj.aggregate_tokens(L, M, "median")
    with pytest.raises(ValueError, match="n_bar"):
        obj.aggregate_tokens(L, M, "sum_scaled")


def test_sum_scaled_equals_mean_when_lengths_equal():
    v = torch.rand(5, 7)
    m = torch.ones(5, 7)
    assert torch.allclose(obj.aggregate_tokens(v, m, "sum_scaled", n_bar=7.0), obj.aggregate_tokens(v, m, "mean"))
    # and differs when they do not (negative control)
    m[0, 3:] = 0
    assert not torch.allclose(obj.aggregate_tokens(v, m, "sum_scaled", n_bar=5.0), obj.aggregate_tokens(v, m, "mean"))


def test_families_hand_computed():
    b = torch.tensor([[1.0, 1.0, 0.0, 9.0], [3.0, 9.0, 9.0, 9.0]])
    s_ref, t_ref = 4.0, 2.0
    sc = {"S_ref": s_ref, "T_ref": t_ref, "n_bar": 2.0}
    r = obj.reconstruction_per_example(L, b, M, parse_family("raw"), "sum", sc)
    assert r["raw"].tolist() == [6.0, 4.0]
    assert torch.allclose(r["dist_norm"], torch.tensor([6.0, 4.0]) / s_ref)  # dist_norm = raw / S_ref
    w = (b + 1e-3) ** 0.25
    expect = torch.stack([(w[0, :3] * L[0, :3]).sum(), w[1, 0] * 4.0]) / t_ref
    assert torch.allclose(r["tokcc"], expect)
    assert torch.equal(r["active"], r["raw"])
    assert torch.equal(
        obj.reconstruction_per_example(L, b, M, parse_family("dist_norm"), "sum", sc)["active"], r["dist_norm"]
    )
    assert torch.equal(
        obj.reconstruction_per_example(L, b, M, parse_family("tokcc_a0.25"), "sum", sc)["active"], r["tokcc"]
    )
    mixed = obj.reconstruction_per_example(L, b, M, parse_family("dist_tokcc_0.05_0.95"), "sum", sc)["active"]
    assert torch.allclose(mixed, 0.05 * r["dist_norm"] + 0.95 * r["tokcc"])
    # alpha from the family name
    r5 = obj.reconstruction_per_example(L, b, M, parse_family("tokcc_a0.5"), "sum", sc)
    assert r5["tokcc"][1].item() == pytest.approx((3.001**0.5) * 4.0 / t_ref, rel=1e-6)
    batch = obj.reconstruction(L, b, M, parse_family("raw"), "sum", sc)
    assert batch["raw"].item() == 5.0


@pytest.mark.parametrize("agg", ["mean", "sum", "sum_scaled"])
def test_tokcc_is_one_when_l_equals_b(agg):
    torch.manual_seed(0)
    b = torch.rand(6, 9) * 3
    m = (torch.rand(6, 9) > 0.3).long()
    m[:, 0] = 1
    b_lists = [b[i][m[i].bool()].tolist() for i in range(6)]
    s_ref, t_ref = obj.reference_scales(b_lists, agg, 0.25, n_bar=5.0)
    r = obj.reconstruction(
        b.clone(), b, m, parse_family("tokcc_a0.25"), agg, {"S_ref": s_ref, "T_ref": t_ref, "n_bar": 5.0}
    )
    assert r["tokcc"].item() == pytest.approx(1.0, rel=1e-5)
    assert r["dist_norm"].item() == pytest.approx(1.0, rel=1e-5)
    # a model twice as bad is at 2
    r2 = obj.reconstruction(
        2 * b, b, m, parse_family("tokcc_a0.25"), agg, {"S_ref": s_ref, "T_ref": t_ref, "n_bar": 5.0}
    )
    assert r2["tokcc"].item() == pytest.approx(2.0, rel=1e-5)


def test_reference_scales_hand_computed():
    s, t = obj.reference_scales([[1.0, 3.0], [2.0]], "sum", alpha=0.0)
    assert s == pytest.approx(3.0)  # (4 + 2) / 2
    assert t == pytest.approx(3.0)  # alpha 0: w = 1
    s, _ = obj.reference_scales([[1.0, 3.0], [2.0]], "mean", alpha=0.0)
    assert s == pytest.approx(2.0)
    with pytest.raises(ValueError):
        obj.reference_scales([[1.0], []], "sum")


def test_gaussian_kl_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    mu_q, lv_q = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g) * 0.5
    mu_r, lv_r = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g) * 0.5
    kl = obj.gaussian_kl(mu_q, lv_q, mu_r, lv_r)
    q = torch.distributions.Normal(mu_q, (0.5 * lv_q).exp())
    r = torch.distributions.Normal(mu_r, (0.5 * lv_r).exp())
    z = q.sample((200_000,))
    mc = (q.log_prob(z) - r.log_prob(z)).sum(-1).mean(0)
    assert torch.allclose(kl, mc, atol=0.03, rtol=0.02)
    assert torch.allclose(obj.gaussian_kl(mu_q, lv_q, mu_q, lv_q), torch.zeros(3), atol=1e-6)
    # hand value: 1-d, N(1, 1) vs N(0, 1) -> 0.5
    assert obj.gaussian_kl(torch.ones(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1)).item() == 0.5


def test_diagnostics():
    lv = torch.log(torch.tensor([[1.0, 4.0], [2.0, 1.0]]))
    assert obj.posterior_variance(lv).item() == pytest.approx(2.0)
    # router Gaussians all N(0, 1): marginal N(0, 1), KL 0
    assert obj.router_marginal_kl_to_prior(torch.zeros(5, 3), torch.zeros(5, 3)).item() == pytest.approx(0.0, abs=1e-6)
    # 1-d, means +-1, unit variance: marginal N(0, 2): KL = 0.5 (2 - 1 - log 2)
    v = obj.router_marginal_kl_to_prior(torch.tensor([[1.0], [-1.0]]), torch.zeros(2, 1)).item()
    assert v == pytest.approx(0.5 * (1 - math.log(2)))


def test_token_nll():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    assert obj.token_nll(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(4))


@pytest.mark.parametrize("family", ["dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95"])
def test_sum_scaled_equals_sum_for_normalized_families_but_not_raw(family):
    """The identity behind running sum_scaled for raw only: S_ref and T_ref are computed under
    the same aggregation, so sum_scaled's 1 / n_bar cancels in every normalized family."""
    from latentstrat.modeling.objective import reconstruction_per_example, reference_scales

    g = torch.Generator().manual_seed(0)
    lens = [3, 7, 12, 5]
    b_val = [torch.rand(n, generator=g).tolist() for n in (4, 9, 6)]
    L = max(lens)
    mask = torch.zeros(len(lens), L)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    l, b = torch.rand(len(lens), L, generator=g) * 2, torch.rand(len(lens), L, generator=g)
    n_bar = 6.5
    out = {}
    for agg in ("sum", "sum_scaled"):
        s, t = reference_scales(b_val, agg, 0.25, n_bar)
        out[agg] = reconstruction_per_example(
            l, b, mask, parse_family(family), agg, {"S_ref": s, "T_ref": t, "n_bar": n_bar}
        )
    assert torch.allclose(out["sum"]["active"], out["sum_scaled"]["active"], rtol=1e-6)
    # raw is not normalized: sum_scaled is sum / n_bar
    assert torch.allclose(out["sum"]["raw"] / n_bar, out["sum_scaled"]["raw"])
    assert not torch.allclose(out["sum"]["raw"], out["sum_scaled"]["raw"])
