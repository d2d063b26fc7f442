"""Proxy language models for the mixture search: tokenizer, per-cluster token stores,
mixture sampler, tiny GPT, training loop and evaluation (bits-per-byte, lm-eval style tasks).

Typical flow::

    tok = train_bpe(texts, 8192, "run/tokenizer.json")
    write_shard_tokens(texts, clusters, tok, "run/tokens", "shard-000")
    merge_token_stores("run/tokens", ["shard-000"], n_clusters)
    sampler = MixtureSampler(TokenStore("run/tokens"), weights, 128, 16, seed=0)
    model, stats = train(GPTConfig(tok.vocab_size), TrainConfig(), sampler, seed=0)
    bits_per_byte(model, tok, heldout)

Tests: ``pytest tests/test_proxies_*.py``.
"""

from .evaluate import bits_per_byte, evaluate_task, load_tasks
from .model import GPT, GPTConfig
from .sampler import MixtureSampler
from .tokenizer import EOS_TOKEN, Tokenizer, load_tokenizer, train_bpe
from .tokens import TokenStore, merge_token_stores, write_shard_tokens
from .train import TrainConfig, lr_at, train

__all__ = [
    "EOS_TOKEN",
    "GPT",
    "GPTConfig",
    "MixtureSampler",
    "Tokenizer",
    "TokenStore",
    "TrainConfig",
    "bits_per_byte",
    "evaluate_task",
    "load_tasks",
    "load_tokenizer",
    "lr_at",
    "merge_token_stores",
    "train",
    "train_bpe",
    "write_shard_tokens",
]
