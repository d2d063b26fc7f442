"""Tests for proxies.model (attention, causality, loss) and proxies.train (schedule, training).

Run: PYTHONPATH=. python -m pytest tests/test_proxies_model.py -q
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from proxies.model import GPT, GPTConfig
from proxies.sampler import MixtureSampler
from proxies.tokenizer import train_bpe
from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens
from proxies.train import TrainConfig, lr_at, train


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine has 2 shared cores; one intra-op thread is faster under contention.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


CFG = GPTConfig(vocab_size=128, n_layer=2, n_head=4, n_embd=32, seq_len=16)


def test_sdpa_attention_matches_written_out_masked_softmax():
    model = GPT(CFG, seed=0)
    attn = model.blocks[0].attn
    x = torch.randn(3, 11, CFG.n_embd, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, k, v = attn.split_heads(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        T = x.size(1)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        ref = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(x.shape)
        ref = attn.c_proj(ref)
        out = attn(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_future_token_does_not_change_earlier_logits():
    model = GPT(CFG, seed=0).eval()
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=g)
    idx2 = idx.clone()
    idx2[:, 9] = (idx2[:, 9] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(idx2)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=1e-6, rtol=0)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_loss_ignore_index_and_token_logprobs_agree():
    model = GPT(CFG, seed=0).eval()
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len + 1), generator=g)
    x, y = idx[:, :-1], idx[:, 1:].clone()
    with torch.no_grad():
        logits, loss = model(x, y)
        lp = model.token_logprobs(idx)
    assert lp.shape == (2, CFG.seq_len)
    torch.testing.assert_close(loss, -lp.mean(), atol=1e-5, rtol=1e-5)
    y[:, :5] = -1
    with torch.no_grad():
        _, loss_masked = model(x, y)
    expected = F.cross_entropy(logits[:, 5:].reshape(-1, CFG.vocab_size), y[:, 5:].reshape(-1))
    torch.testing.assert_close(loss_masked, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, CFG.seq_len + 1, dtype=torch.long))


def test_weight_tying_init_and_rng_isolation():
    state = torch.random.get_rng_state()
    m1, m2 = GPT(CFG, seed=5), GPT(CFG, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert m1.lm_head.weight is m1.wte.weight
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    # Tied head counted once; residual projections use the scaled-down std.
    n_expected = sum(p.numel() for n, p in m1.named_parameters())
    assert m1.num_params() == n_expected
    assert m1.num_params(non_embedding=True) == n_expected - (CFG.vocab_size + CFG.seq_len) * CFG.n_embd
    big = GPT(GPTConfig(vocab_size=64, n_layer=8, n_embd=256, n_head=4, seq_len=8), seed=0)
    assert big.blocks[0].attn.c_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert big.blocks[0].attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_lr_schedules():
    cos = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1, schedule="cosine")
    lrs = [lr_at(s, cos) for s in range(cos.steps)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))
    assert lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4)
    assert lrs[55] == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 45 / 89)) * 9e-4)

    wsd = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1, schedule="wsd", decay_frac=0.2)
    lrs = [lr_at(s, wsd) for s in range(wsd.steps)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))
    assert lrs[9:80] == [pytest.approx(1e-3)] * 71
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:]))
    assert lrs[-1] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="linear")


TEXTS = [
    "the quick brown fox jumps over the lazy dog. " * 4,
    "one two three four five six seven eight nine ten. " * 3,
    "abc abc abc abc abc abc abc abc. ",
] * 8


@pytest.fixture(scope="module")
def store_and_tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    tok = train_bpe(iter(TEXTS), 320, d / "tokenizer.json")
    write_shard_tokens(TEXTS, [0] * len(TEXTS), tok, d / "tokens", "s0")
    merge_token_stores(d / "tokens", ["s0"], 1)
    return TokenStore(d / "tokens"), tok


def _train(store, tok, seed, steps, sampler_seed=0):
    mcfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=64, seq_len=32)
    tcfg = TrainConfig(steps=steps, batch_size=8, warmup_steps=5, log_every=10)
    sampler = MixtureSampler(store, np.array([1.0]), seq_len=32, batch_size=8, seed=sampler_seed)
    return train(mcfg, tcfg, sampler, seed=seed)


def test_training_reduces_loss(store_and_tok):
    model, stats = _train(*store_and_tok, seed=0, steps=40)
    assert len(stats["losses"]) == 40 and stats["steps"] == 40
    assert stats["tokens"] == 40 * 8 * 32
    assert stats["final_loss"] < 0.7 * stats["losses"][0]
    assert stats["final_loss"] == pytest.approx(np.mean(stats["losses"][-4:]))
    assert stats["finite"] and stats["tokens_per_s"] > 0
    assert not model.training


def test_training_deterministic_and_rng_isolated(store_and_tok):
    state = torch.random.get_rng_state()
    _, a = _train(*store_and_tok, seed=1, steps=6)
    _, b = _train(*store_and_tok, seed=1, steps=6)
    _, c = _train(*store_and_tok, seed=2, steps=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a["losses"] == b["losses"]
    assert a["losses"] != c["losses"]


def test_gradient_accumulation_batch_check(store_and_tok):
    store, tok = store_and_tok
    mcfg = GPTConfig(vocab_size=tok.vocab_size, seq_len=32)
    sampler = MixtureSampler(store, np.array([1.0]), seq_len=32, batch_size=4, seed=0)
    _, stats = train(mcfg, TrainConfig(steps=2, batch_size=8, log_every=0), sampler, seed=0)
    assert stats["tokens"] == 2 * 8 * 32
    with pytest.raises(ValueError, match="multiple"):
        train(mcfg, TrainConfig(steps=2, batch_size=6), sampler, seed=0)


@pytest.mark.parametrize("pause", [3, 12])  # before and inside the tail average (last 40%: steps 12-19)
def test_a_paused_and_resumed_run_equals_an_unbroken_one(store_and_tok, tmp_path, pause):
    """Weights, optimizer, step losses, tail average, RNG (dropout) and the sampler's place all
    carry over a pause: the continued run ends bit for bit where an unbroken one does."""
    store, tok = store_and_tok
    mcfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32, seq_len=32, dropout=0.1)
    tcfg = TrainConfig(steps=20, batch_size=8, warmup_steps=3, log_every=0, average_last=0.4)

    def sampler():
        return MixtureSampler(store, np.array([1.0]), seq_len=32, batch_size=4, seed=5)  # 2 micro-batches
    whole, ws = train(mcfg, tcfg, sampler(), seed=3)
    part, ps = train(mcfg, tcfg, sampler(), seed=3, stop_at=pause)
    assert ps["steps"] == pause and ps["tokens"] == pause * 8 * 32 and ps["losses"] == ws["losses"][:pause]
    torch.save(ps["state"], tmp_path / "state.pt")  # it goes through a file in a search
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    done, ds = train(mcfg, tcfg, sampler(), seed=3, resume=state)
    assert ds["losses"] == ws["losses"] and ds["steps"] == 20 and ds["tokens"] == ws["tokens"]
    for a, b in zip(whole.state_dict().values(), done.state_dict().values()):
        assert torch.equal(a, b)
    # Resuming with a sampler that is not the first one's would not continue the same run.
    _, other = train(mcfg, tcfg, MixtureSampler(store, np.array([1.0]), seq_len=32, batch_size=4, seed=6),
                     seed=3, resume=state)
    assert other["losses"][pause:] != ws["losses"][pause:]
    with pytest.raises(ValueError, match="stop_at"):
        train(mcfg, tcfg, sampler(), seed=3, stop_at=20)
