"""Tests for proxies.evaluate: bits-per-byte and lm-eval style task scoring.

Most checks use a bigram "model" (logits = table[previous token]) and a byte
tokenizer, so the expected log-likelihoods can be computed by hand.

Run: PYTHONPATH=. python -m pytest tests/test_proxies_eval.py -q
"""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from proxies.evaluate import bits_per_byte, evaluate_task, load_tasks, score_requests
from proxies.model import GPT, GPTConfig
from proxies.sampler import MixtureSampler
from proxies.tokenizer import train_bpe
from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens
from proxies.train import TrainConfig, train


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


class ByteTok:
    vocab_size = 320
    eos_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]


class Bigram(torch.nn.Module):
    def __init__(self, table, seq_len):
        super().__init__()
        self.table = torch.nn.Parameter(table)
        self.config = SimpleNamespace(seq_len=seq_len)

    def forward(self, idx, targets=None):
        assert idx.shape[1] <= self.config.seq_len
        return self.table[idx], None


def _logp(table, prev, nxt):
    return torch.log_softmax(table[prev].double(), dim=-1)[nxt].item()


def _ref_loglik(table, ctx, cont):
    ids = list(ctx.encode()) or [ByteTok.eos_id]
    cont_ids = list(cont.encode())
    seq = ids + cont_ids
    return sum(_logp(table, seq[i - 1], seq[i]) for i in range(len(ids), len(seq)))


def _table(seed=0, boosts=()):
    t = torch.randn(320, 320, generator=torch.Generator().manual_seed(seed))
    for s, amount in boosts:
        b = s.encode()
        for p, n in zip(b[:-1], b[1:]):
            t[p, n] += amount
    return t


def test_bits_per_byte_matches_hand_computation():
    table = _table(1)
    texts = ["ab", "héllo wörld", "", "xyz!"]
    stream = [256]
    for t in texts:
        stream += list(t.encode()) + [256]
    nll = -sum(_logp(table, a, b) for a, b in zip(stream[:-1], stream[1:]))
    expected = nll / (math.log(2) * sum(len(t.encode()) for t in texts))
    model = Bigram(table, seq_len=3)
    for bs in (1, 2, 16):
        assert bits_per_byte(model, ByteTok(), texts, batch_size=bs) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError):
        bits_per_byte(model, ByteTok(), [""])


def test_bits_per_byte_windows_with_real_gpt():
    # A transformer sees window boundaries (bigram does not): check against explicit windows.
    model = GPT(GPTConfig(vocab_size=320, n_layer=1, n_head=2, n_embd=32, seq_len=5), seed=0)
    model.train()
    texts = ["hello there", "ab", "the end of the text"]
    stream = torch.tensor([256] + [i for t in texts for i in list(t.encode()) + [256]])
    T = model.config.seq_len
    with torch.no_grad():
        nll = -sum(model.token_logprobs(stream[s : s + T + 1][None]).sum().item() for s in range(0, len(stream) - 1, T))
    expected = nll / (math.log(2) * sum(len(t.encode()) for t in texts))
    assert bits_per_byte(model, ByteTok(), texts, batch_size=3) == pytest.approx(expected, rel=1e-5)
    assert model.training, "bits_per_byte must restore the model's training flag"


def test_trained_model_has_lower_bits_per_byte(tmp_path):
    rng = np.random.default_rng(0)
    words = ["red", "green", "blue", "cat", "dog", "runs", "sleeps", "the", "a"]
    texts = [" ".join(rng.choice(words, 8)) + "." for _ in range(80)]
    tok = train_bpe(iter(texts), 300, tmp_path / "tokenizer.json")
    write_shard_tokens(texts[:60], [0] * 60, tok, tmp_path / "tok", "s")
    merge_token_stores(tmp_path / "tok", ["s"], 1)
    sampler = MixtureSampler(TokenStore(tmp_path / "tok"), np.array([1.0]), 32, 8, seed=0)
    mcfg = GPTConfig(vocab_size=tok.vocab_size, seq_len=32)
    trained, _ = train(mcfg, TrainConfig(steps=30, batch_size=8, warmup_steps=3), sampler, seed=0)
    held_out = texts[60:]
    bpb_trained = bits_per_byte(trained, tok, held_out)
    bpb_untrained = bits_per_byte(GPT(mcfg, seed=0), tok, held_out)
    assert bpb_trained < 0.7 * bpb_untrained


def test_load_tasks_formats_and_errors(tmp_path):
    good = [
        {"query": "Question: 1+1?", "choices": ["2", "3"], "gold": 0},
        {"context": "The sky is", "continuation": " blue"},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in good) + "\n\n")
    assert load_tasks(p) == good
    bad_lines = [
        "{not json",
        json.dumps({"query": "q", "choices": ["a"], "gold": 3}),
        json.dumps({"query": "q", "choices": ["a"], "gold": True}),
        json.dumps({"context": "c"}),
        json.dumps(["a"]),
    ]
    for bad in bad_lines:
        p.write_text(json.dumps(good[0]) + "\n\n" + bad + "\n")
        with pytest.raises(ValueError, match=r"t\.jsonl:3"):
            load_tasks(p)
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "none.jsonl")


LONG = " a very long answer"
BOOSTS = [(":" + LONG, 4.0), ("abcde", 8.0), (" 4", 6.0)]
ITEMS = [
    # "Question:" rule: context + "\nAnswer:", continuation " " + choice.
    {"query": "Question: 2+2?", "choices": ["5", "4", "22"], "gold": 1},
    # Plain query: continuation is the choice as-is, leading space kept.
    {"query": "Color:", "choices": [" red", LONG], "gold": 1},
    {"context": "abc", "continuation": "de"},
    {"context": "abc", "continuation": "dz"},
]
EXPECTED_REQUESTS = [
    [("Question: 2+2?\nAnswer:", " 5"), ("Question: 2+2?\nAnswer:", " 4"), ("Question: 2+2?\nAnswer:", " 22")],
    [("Color:", " red"), ("Color:", LONG)],
    [("abc", "de")],
    [("abc", "dz")],
]


def _expected_metrics(table, item, reqs):
    lls = np.array([_ref_loglik(table, c, k) for c, k in reqs])
    if "choices" in item:
        g = item["gold"]
        lens = np.array([len(c.encode()) for c in item["choices"]])
        acc = float(np.argmax(lls) == g)
        return acc, float(np.argmax(lls / lens) == g), -lls[g] / len(reqs[g][1].encode())
    greedy = all(
        int(torch.argmax(table[p])) == n for p, n in zip(("abc" + item["continuation"]).encode()[2:], item["continuation"].encode())
    )
    return float(greedy), float(greedy), -lls[0] / len(item["continuation"].encode())


def test_evaluate_task_handmade_items():
    table = _table(2, BOOSTS)
    model = Bigram(table, seq_len=64)
    tok = ByteTok()
    per_item = []
    for item, reqs, (acc, acc_norm) in zip(ITEMS, EXPECTED_REQUESTS, [(1, 1), (0, 1), (1, 1), (0, 0)]):
        m = evaluate_task(model, tok, [item], batch_size=2)
        exp = _expected_metrics(table, item, reqs)
        assert (m["acc"], m["acc_norm"]) == (acc, acc_norm) == exp[:2]
        assert m["gold_loss_per_byte"] == pytest.approx(exp[2], rel=1e-6)
        assert m["n"] == 1
        per_item.append(exp)
    both = evaluate_task(model, tok, ITEMS, batch_size=3)
    mean = np.mean(per_item, axis=0)
    assert both["n"] == 4
    assert (both["acc"], both["acc_norm"]) == pytest.approx((mean[0], mean[1]))
    assert both["gold_loss_per_byte"] == pytest.approx(mean[2], rel=1e-6)
    assert evaluate_task(model, tok, ITEMS, limit=2)["n"] == 2


def test_score_requests_matches_full_sequence_gpt():
    # Real transformer: padding, batching and left truncation must not change scores.
    model = GPT(GPTConfig(vocab_size=320, n_layer=2, n_head=2, n_embd=32, seq_len=16), seed=3)
    reqs = [
        ("short", " cont"),
        ("a context that is much longer than sixteen bytes", " tail"),
        ("", "empty context"),
        ("mid ctx", "x"),
    ]
    got = score_requests(model, ByteTok(), reqs, batch_size=3)
    for (ctx, cont), (ll, _) in zip(reqs, got):
        ctx_ids = list(ctx.encode()) or [256]
        cont_ids = list(cont.encode())
        ids = torch.tensor((ctx_ids + cont_ids)[-17:])[None]
        with torch.no_grad():
            lp = model.token_logprobs(ids)[0]
        assert ll == pytest.approx(lp[-len(cont_ids) :].sum().item(), abs=1e-4)
    one_by_one = score_requests(model, ByteTok(), reqs, batch_size=1)
    assert [g[0] for g in got] == pytest.approx([o[0] for o in one_by_one], abs=1e-4)
    assert [g[1] for g in got] == [o[1] for o in one_by_one]


def test_long_continuations_warn_once_per_request_set(caplog):
    # Every proxy of a search scores the same requests: one warning, not one per item per proxy.
    model = GPT(GPTConfig(vocab_size=320, n_layer=1, n_head=2, n_embd=16, seq_len=8), seed=0)
    reqs = [("ctx", " a continuation longer than eight bytes"), ("c", " another long continuation"), ("c", " ok")]
    with caplog.at_level("WARNING", logger="proxies.evaluate"):
        for _ in range(3):
            got = score_requests(model, ByteTok(), reqs)
    msgs = [r.getMessage() for r in caplog.records if "exceed seq_len" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith("2 of 3 continuations exceed seq_len=8")
    assert len(got) == 3 and all(math.isfinite(ll) for ll, _ in got)


class _AutocastRecorder:
    """Stands in for torch.autocast: records each request, enters nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, device_type, dtype=None, **kwargs):
        import contextlib
        self.calls.append((device_type, dtype))
        return contextlib.nullcontext()


@pytest.fixture
def fake_cuda(monkeypatch):
    """Evaluation on device "cuda" with the tensors left on the CPU; returns the autocast recorder."""
    import proxies.evaluate as ev
    rec = _AutocastRecorder()
    monkeypatch.setattr(ev, "_to_device", lambda t, device: t)
    monkeypatch.setattr(torch, "autocast", rec)
    return rec


def test_fp32_proxy_is_evaluated_without_bf16_autocast_on_cuda(fake_cuda):
    from proxies.train import uses_bf16
    model = GPT(GPTConfig(vocab_size=320, n_layer=1, n_head=2, n_embd=16, seq_len=16), seed=0)
    texts = ["some held-out text", "and another one"]
    reqs = [("ctx", " cont"), ("other", " x")]
    items = [{"query": "q", "choices": [" a", " b"], "gold": 0}]
    cuda = torch.device("cuda")
    bf16 = uses_bf16(cuda, "fp32", model.config.n_embd)
    assert bf16 is False
    bpb = bits_per_byte(model, ByteTok(), texts, device="cuda", bf16=bf16)
    scores = score_requests(model, ByteTok(), reqs, device="cuda", bf16=bf16)
    evaluate_task(model, ByteTok(), items, device="cuda", bf16=bf16)
    assert fake_cuda.calls == []  # fp32 training, fp32 evaluation
    # ... and the numbers are the CPU's own
    assert bpb == bits_per_byte(model, ByteTok(), texts)
    assert scores == score_requests(model, ByteTok(), reqs)

    # A bf16 proxy is evaluated under bf16 autocast, once per call.
    assert uses_bf16(cuda, "bf16", model.config.n_embd)
    bits_per_byte(model, ByteTok(), texts, device="cuda", bf16=True)
    evaluate_task(model, ByteTok(), items, device="cuda", bf16=True)
    assert fake_cuda.calls == [("cuda", torch.bfloat16)] * 2


def test_evaluation_precision_defaults_keep_the_device_default(fake_cuda):
    from proxies.evaluate import inference_autocast
    model = GPT(GPTConfig(vocab_size=320, n_layer=1, n_head=2, n_embd=16, seq_len=16), seed=0)
    bits_per_byte(model, ByteTok(), ["text"], device="cpu")
    assert fake_cuda.calls == []  # no autocast on a CPU unless asked for
    bits_per_byte(model, ByteTok(), ["text"], device="cuda")
    assert fake_cuda.calls == [("cuda", torch.bfloat16)]  # bf16 on CUDA when nobody says otherwise
    inference_autocast(torch.device("cpu"), bf16=True)
    assert fake_cuda.calls[-1] == ("cpu", torch.bfloat16)


@pytest.mark.gpu
def test_fp32_evaluation_on_cuda_matches_the_cpu():
    model = GPT(GPTConfig(vocab_size=320, n_layer=2, n_head=2, n_embd=32, seq_len=16), seed=1)
    texts = ["a held-out text for the GPU", "with a second document in it"]
    reqs = [("context", " continuation"), ("", "empty context")]
    cpu_bpb = bits_per_byte(model, ByteTok(), texts)
    cpu_scores = score_requests(model, ByteTok(), reqs)
    gpu = GPT(GPTConfig(vocab_size=320, n_layer=2, n_head=2, n_embd=32, seq_len=16), seed=1).to("cuda")
    assert bits_per_byte(gpu, ByteTok(), texts, device="cuda", bf16=False) == pytest.approx(cpu_bpb, rel=1e-5)
    got = score_requests(gpu, ByteTok(), reqs, device="cuda", bf16=False)
    assert [g[0] for g in got] == pytest.approx([c[0] for c in cpu_scores], abs=1e-4)
    # bf16 autocast does change the numbers: what the fp32 path is there to avoid
    assert bits_per_byte(gpu, ByteTok(), texts, device="cuda", bf16=True) != cpu_bpb


def test_a_run_scores_its_proxies_in_their_training_precision_on_cuda(fake_cuda, tmp_path):
    """climb.runtime.proxy_runs passes the proxy's precision down: fp32 proxies on CUDA are scored in fp32."""
    from dataclasses import replace
    from climb.config import ProxyConfig, TargetConfig
    from climb.runtime.proxy_runs import ProxyTask, evaluate_task_metrics
    (tmp_path / "t.jsonl").write_text('{"text": "some held-out text"}\n')
    model = GPT(GPTConfig(vocab_size=320, n_layer=1, n_head=2, n_embd=16, seq_len=16), seed=0)
    task = ProxyTask(mixture_id="m", iteration=0, weights=(1.0,), seed=0, tokens_dir="", run_dir=str(tmp_path),
                     proxy=ProxyConfig(precision="fp32"), target=TargetConfig(texts=(str(tmp_path / "t.jsonl"),)))
    fp32 = evaluate_task_metrics(model, ByteTok(), task, "cuda")
    assert fake_cuda.calls == []
    assert fp32["bpb"] == evaluate_task_metrics(model, ByteTok(), task, "cpu")["bpb"]
    evaluate_task_metrics(model, ByteTok(), replace(task, proxy=replace(task.proxy, precision="bf16")), "cuda")
    assert fake_cuda.calls == [("cuda", torch.bfloat16)]
