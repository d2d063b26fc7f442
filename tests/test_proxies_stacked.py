"""The stacked swarm trainer equals training the proxies one by one.

Run: PYTHONPATH=. python -m pytest tests/test_proxies_stacked.py -q
"""
import numpy as np
import pytest
import torch

from proxies.model import GPT, GPTConfig
from proxies.sampler import MixtureSampler
from proxies.stacked import StackedGPT, _clip_per_proxy, train_stacked
from proxies.train import TrainConfig, train

CFG = GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32, seq_len=16)


MIXTURES = [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]


def _samplers(store, seeds, batch=8):
    return [MixtureSampler(store, np.array(w), CFG.seq_len, batch, seed=s) for w, s in zip(MIXTURES, seeds)]


def test_unstack_round_trip_and_forward_match_each_model():
    models = [GPT(CFG, seed=s) for s in range(3)]
    stacked = StackedGPT(models)
    x = torch.randint(0, CFG.vocab_size, (3, 4, CFG.seq_len + 1))
    got = stacked(x[..., :-1], x[..., 1:])
    want = torch.stack([m(x[p, :, :-1], x[p, :, 1:])[1] for p, m in enumerate(models)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(models, stacked.unstack()):
        for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(pa, pb), name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stacked_training_matches_one_by_one(store, precision):
    # Own seeds per proxy, a clip that bites, and two micro-batches per step.
    tcfg = TrainConfig(steps=30, batch_size=8, lr=1e-2, warmup_steps=2, grad_clip=0.5, log_every=0,
                       precision=precision)
    seeds = [3, 4, 3]
    single = [train(CFG, tcfg, s, seed=seed) for s, seed in zip(_samplers(store, seeds, batch=4), seeds)]
    stacked = train_stacked(CFG, tcfg, _samplers(store, seeds, batch=4), seeds=seeds)
    for (m1, s1), (m2, s2) in zip(single, stacked):
        gap = np.abs(np.array(s1["losses"]) - np.array(s2["losses"]))
        if precision == "fp32":
            assert gap.max() < 1e-4, gap
        else:  # bf16 rounding differs between the batched and the plain kernels
            assert np.median(gap) < 0.01 and gap.max() < 0.1, gap
        assert s2["tokens"] == s1["tokens"] == 30 * 8 * CFG.seq_len
        assert not m2.training
        if precision == "fp32":
            for (name, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
                torch.testing.assert_close(a, b, rtol=0, atol=2e-3, msg=name)
    # The proxies really differ (own mixtures), and each learned.
    finals = [s["final_loss"] for _, s in stacked]
    assert len({round(f, 3) for f in finals}) == 3
    assert all(s["final_loss"] < s["losses"][0] - 0.2 for _, s in stacked)  # ln 256 -> towards ln 99


def test_per_proxy_clipping_equals_clip_grad_norm():
    g = [torch.randn(3, 5, 4) * torch.tensor([0.01, 1.0, 10.0]).view(3, 1, 1), torch.randn(3, 7)]
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in g]
    for p, t in zip(params, g):
        p.grad = t.clone()
    norms = _clip_per_proxy(params, 1.0)
    for i in range(3):
        ref = [torch.nn.Parameter(torch.zeros_like(t[i])) for t in g]
        for p, t in zip(ref, g):
            p.grad = t[i].clone()
        want = torch.nn.utils.clip_grad_norm_(ref, 1.0)
        assert norms[i].item() == pytest.approx(want.item(), rel=1e-5)
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.grad[i], r.grad)


def test_stacked_errors(store):
    with pytest.raises(ValueError, match="same GPTConfig"):
        StackedGPT([GPT(CFG, seed=0), GPT(GPTConfig(vocab_size=256, n_embd=64, seq_len=16), seed=0)])
    with pytest.raises(ValueError, match="dropout"):
        StackedGPT([GPT(GPTConfig(vocab_size=256, seq_len=16, dropout=0.1), seed=0)])
    with pytest.raises(ValueError, match="one seed per sampler"):
        train_stacked(CFG, TrainConfig(steps=1, batch_size=8), _samplers(store, [0, 1]), seeds=[0])


def test_tail_average_is_the_mean_of_the_last_weights_and_stacks(store):
    from proxies.train import TailAverage, average_from
    m = torch.nn.Linear(2, 1)
    avg = TailAverage()
    seen = []
    for v in (1.0, 2.0, 6.0):
        with torch.no_grad():
            m.weight.fill_(v)
        avg.update(m)
        seen.append(v)
    avg.copy_to(m)
    assert torch.allclose(m.weight, torch.full_like(m.weight, np.mean(seen)))
    assert average_from(TrainConfig(steps=100, average_last=0.2)) == 80
    assert average_from(TrainConfig(steps=100)) == 100
    with pytest.raises(ValueError, match="average_last"):
        TrainConfig(average_last=1.0)
    # averaged proxies trained one by one equal averaged proxies trained stacked,
    # and differ from the last weights
    tcfg = TrainConfig(steps=20, batch_size=8, lr=1e-2, warmup_steps=2, log_every=0, precision="fp32",
                       average_last=0.5)
    seeds = [3, 4, 5]
    single = [train(CFG, tcfg, s, seed=seed)[0] for s, seed in zip(_samplers(store, seeds), seeds)]
    stacked = [m for m, _ in train_stacked(CFG, tcfg, _samplers(store, seeds), seeds=seeds)]
    last = train(CFG, TrainConfig(steps=20, batch_size=8, lr=1e-2, warmup_steps=2, log_every=0, precision="fp32"),
                 _samplers(store, seeds)[0], seed=3)[0]
    for a, b in zip(single, stacked):
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pa, pb, rtol=0, atol=2e-3)  # as one-by-one vs stacked above
    assert not torch.allclose(single[0].wte.weight, last.wte.weight)


def test_untied_head_stacks_and_trains_like_one_by_one(store):
    cfg = GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32, seq_len=16, tie_embeddings=False)
    m = GPT(cfg, seed=0)
    assert m.lm_head.weight.data_ptr() != m.wte.weight.data_ptr()
    assert m.num_params() == GPT(CFG, seed=0).num_params() + 256 * 32
    models = [GPT(cfg, seed=s) for s in range(2)]
    stacked = StackedGPT(models)
    x = torch.randint(0, 256, (2, 3, 17))
    want = torch.stack([mm(x[p, :, :-1], x[p, :, 1:])[1] for p, mm in enumerate(models)])
    torch.testing.assert_close(stacked(x[..., :-1], x[..., 1:]), want, rtol=1e-5, atol=1e-5)
    for a, b in zip(models, stacked.unstack()):
        assert torch.equal(a.lm_head.weight, b.lm_head.weight) and torch.equal(a.wte.weight, b.wte.weight)
    tcfg = TrainConfig(steps=15, batch_size=8, lr=1e-2, warmup_steps=2, log_every=0, precision="fp32")
    seeds = [3, 4]
    samplers = [MixtureSampler(store, np.array(w), 16, 8, seed=s) for w, s in zip(MIXTURES, seeds)]
    single = [train(cfg, tcfg, s, seed=seed)[1]["losses"] for s, seed in zip(samplers, seeds)]
    samplers = [MixtureSampler(store, np.array(w), 16, 8, seed=s) for w, s in zip(MIXTURES, seeds)]
    both = [st["losses"] for _, st in train_stacked(cfg, tcfg, samplers, seeds=seeds)]
    assert np.abs(np.array(single) - np.array(both)).max() < 1e-4
