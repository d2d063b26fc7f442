"""Proxies continued from a shared base: step for step a run trained from scratch on the
base's data first, one by one and stacked; and merged models are weighted averages.

Run: PYTHONPATH=. python -m pytest tests/test_proxies_base.py -q
"""
import sys

import numpy as np
import pytest
import torch

from proxies.model import GPTConfig
from proxies.sampler import MixtureSampler, SwitchSampler
from proxies.stacked import train_stacked
from proxies.train import TrainConfig, train

CFG = GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32, seq_len=16, tie_embeddings=False)
NATURAL = [0.5, 0.3, 0.2]
MIXTURES = [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]
F = 12  # the base's steps
TCFG = TrainConfig(steps=30, batch_size=8, lr=1e-2, warmup_steps=3, grad_clip=0.5, log_every=0, precision="fp32")


def _sampler(store, w, seed, batch=4):
    return MixtureSampler(store, np.array(w), CFG.seq_len, batch, seed=seed, exact=True, common=True)


def _base(store, tcfg=TCFG, batch=4):
    _, stats = train(CFG, tcfg, _sampler(store, NATURAL, 7, batch), seed=7, stop_at=F)
    return stats["state"]


@pytest.mark.parametrize("batch", [8, 4])  # one micro-batch a step, and two
def test_continued_equals_scratch_whose_first_steps_were_the_base(store, batch):
    base = _base(store, batch=batch)
    accum = TCFG.batch_size // batch
    for w in MIXTURES[:2]:
        scratch_sampler = SwitchSampler(_sampler(store, NATURAL, 7, batch), _sampler(store, w, 100, batch), F * accum)
        m1, s1 = train(CFG, TCFG, scratch_sampler, seed=7)
        m2, s2 = train(CFG, TCFG, SwitchSampler(None, _sampler(store, w, 100, batch), F * accum), seed=12345,
                       base=base)
        assert s1["losses"] == s2["losses"]  # bit for bit, every step
        for (name, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
            assert torch.equal(a, b), name
        assert s2["continued_from"] == F and "continued_from" not in s1
    # the base's losses are the first F of every continuation; what follows differs by mixture
    runs = [train(CFG, TCFG, SwitchSampler(None, _sampler(store, w, 100, batch), F * accum), seed=0, base=base)[1]
            for w in MIXTURES]
    assert all(r["losses"][:F] == base["losses"] for r in runs)
    assert len({round(r["final_loss"], 4) for r in runs}) == 3


def test_a_continuation_has_no_data_before_its_base(store):
    s = SwitchSampler(None, _sampler(store, NATURAL, 1), 3)
    with pytest.raises(ValueError, match="skip the base's batches first"):
        s.sample_windows()
    s.skip(5)  # past the switch: the continuation's sampler has given 2 batches
    ref = _sampler(store, NATURAL, 1)
    ref.skip(2)
    assert (s.sample_windows() == ref.sample_windows()).all()


@pytest.mark.parametrize("tied", [False, True])
def test_stacked_continuation_equals_one_by_one(store, tied, monkeypatch):
    if tied:  # a head tied to the embedding is one parameter in both layouts
        monkeypatch.setattr(sys.modules[__name__], "CFG", GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=32,
                                                                    seq_len=16, tie_embeddings=True))
    base = _base(store)
    seeds = [100, 101, 100]
    single = [train(CFG, TCFG, SwitchSampler(None, _sampler(store, w, s), F * 2), seed=0, base=base)
              for w, s in zip(MIXTURES, seeds)]
    stacked = train_stacked(CFG, TCFG, [SwitchSampler(None, _sampler(store, w, s), F * 2)
                                        for w, s in zip(MIXTURES, seeds)], seeds=[0, 0, 0], base=base)
    for (m1, s1), (m2, s2) in zip(single, stacked):
        assert s2["losses"][:F] == base["losses"]
        assert np.abs(np.array(s1["losses"]) - np.array(s2["losses"])).max() < 1e-4
        assert s2["continued_from"] == F
        for (name, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-3, msg=name)


def test_stacked_continuation_keeps_the_base_optimizer_state(store):
    # Were the moments dropped, the first continued step would differ from one by one's at once.
    base = _base(store)
    one = train(CFG, TCFG, SwitchSampler(None, _sampler(store, MIXTURES[0], 5), F * 2), seed=0, base=base)[1]
    fresh = {**base, "optimizer": {"state": {}, "param_groups": base["optimizer"]["param_groups"]}}
    with pytest.raises(KeyError):
        train_stacked(CFG, TCFG, [SwitchSampler(None, _sampler(store, MIXTURES[0], 5), F * 2)], seeds=[0], base=fresh)
    two = train_stacked(CFG, TCFG, [SwitchSampler(None, _sampler(store, MIXTURES[0], 5), F * 2)], seeds=[0],
                        base=base)[0][1]
    assert abs(one["losses"][F] - two["losses"][F]) < 1e-5


def test_a_base_that_does_not_fit_the_run_is_refused(store):
    base = _base(store)
    with pytest.raises(ValueError, match="cannot resume a run paused at step"):
        train(CFG, TrainConfig(steps=10, batch_size=8, log_every=0), SwitchSampler(None, _sampler(store, NATURAL, 1),
                                                                                      F * 2), seed=0, base=base)
    with pytest.raises(ValueError, match="not both"):
        train(CFG, TCFG, _sampler(store, NATURAL, 1), seed=0, base=base, resume=base)


def test_merged_weights_are_the_weighted_average_of_the_continued_models(store):
    from proxies.merge import MergedModels, merge_weights
    base = _base(store)
    experts = [train(CFG, TCFG, SwitchSampler(None, _sampler(store, np.eye(3)[c], 9), F * 2), seed=0, base=base)[0]
               for c in range(3)]
    states = [m.state_dict() for m in experts]
    w = [0.5, 0.2, 0.3]
    merged = merge_weights(states, w)
    for name, t in merged.items():
        want = sum(wi * s[name].double() for wi, s in zip(w, states))
        torch.testing.assert_close(t.double(), want, rtol=0, atol=1e-7)
    model = MergedModels(CFG, states).model(w)
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, merged[name], rtol=0, atol=1e-6, msg=name)
    # a one-hot merge is that model; the merged model is a model (finite, and it scores tokens)
    one = MergedModels(CFG, states).model([0.0, 1.0, 0.0])
    for (name, a), b in zip(one.state_dict().items(), states[1].values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=name)
    x = torch.randint(0, 256, (2, 17))
    assert torch.isfinite(model(x[:, :-1], x[:, 1:])[1])
    with pytest.raises(ValueError, match="sum to 1"):
        merge_weights(states, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="merge weights for 3 models"):
        MergedModels(CFG, states).model([1.0])


def test_windows_read_from_the_files_are_the_mapped_ones(store, monkeypatch):
    """On a CPU the sampler reads windows with pread (ClusterReader), not through a map: the same
    tokens, and the same batches."""
    from proxies.tokens import TokenStore
    rng = np.random.default_rng(1)
    for c in range(store.n_clusters):
        mapped, read = store.array(c), store.reader(c)
        assert len(read) == len(mapped)
        for a in rng.integers(0, len(mapped) - 20, 10):
            assert (read[int(a):int(a) + 17] == mapped[int(a):int(a) + 17]).all()
        assert len(read[len(mapped) - 3:len(mapped) + 5]) == 3 and len(read[5:5]) == 0
    a = _sampler(store, MIXTURES[0], 4)
    via_read = [a.sample_windows() for _ in range(5)]
    monkeypatch.setattr(TokenStore, "reader", TokenStore.array)
    b = _sampler(store, MIXTURES[0], 4)
    assert all((x == b.sample_windows()).all() for x in via_read)
    import pickle
    pickle.loads(pickle.dumps(store.reader(0)))  # travels to a worker process
