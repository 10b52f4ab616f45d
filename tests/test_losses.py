import pytest
import torch

from turngym.trainers.batching import TokenRow, collate, micro_batches
from turngym.trainers.losses import aggregate, kl_k3, ppo_clip_terms

pytestmark = pytest.mark.fast


def test_ppo_clip_hand_values():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_terms(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # A>0, ratio 1.5 -> clipped at 1.28; A>0 ratio .5 -> unclipped .5 (min); A<0 ratio 1.5 ->
    # -1.5 (min of -1.5, -1.28); A<0 ratio .5 -> clipped -0.8
    assert loss.tolist() == pytest.approx([-1.28, -0.5, 1.5, 0.8])
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_k3_is_nonnegative_and_zero_at_equality():
    a = torch.randn(100)
    b = torch.randn(100)
    assert (kl_k3(a, b) >= -1e-7).all()
    assert torch.allclose(kl_k3(a, a), torch.zeros(100))


def test_token_mean_is_invariant_to_micro_batching():
    torch.manual_seed(0)
    rows = [TokenRow(list(range(n)), [0.0] + [1.0] * (n - 1), [0.5] * n, [0.0] * n)
            for n in (3, 7, 5, 9)]
    w = torch.randn(10, requires_grad=True)

    def loss_of(batch, denom):
        b = collate(batch, 0)
        logp = w[b.input_ids] * 0.1
        pg, _ = ppo_clip_terms(logp, b.old_logprobs, b.advantages, 0.2, 0.2)
        return aggregate(pg, b.loss_mask, "token_mean", denom)

    n_tok = sum(sum(r.mask) for r in rows)
    full = loss_of(rows, n_tok)
    g_full, = torch.autograd.grad(full, w)
    total = sum(loss_of(mb, n_tok) for mb in micro_batches(rows, token_budget=12))
    g_micro, = torch.autograd.grad(total, w)
    assert len(micro_batches(rows, 12)) > 1
    assert torch.allclose(full, total) and torch.allclose(g_full, g_micro)


def test_micro_batches_respect_budget_and_keep_every_row():
    rows = [TokenRow([1] * n, [1.0] * n, [0.0] * n, [0.0] * n) for n in (5, 1, 8, 3, 3)]
    mbs = micro_batches(rows, token_budget=10)
    assert sorted(len(r.ids) for mb in mbs for r in mb) == [1, 3, 3, 5, 8]
    for mb in mbs:
        assert len(mb) == 1 or len(mb) * max(len(r.ids) for r in mb) <= 10


def test_unknown_aggregation_fails():
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2), torch.ones(2), "bogus")
