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

import importlib
import sys
import types

# Imported on first use, so that importing one submodule (e.g. proxies.atomic from
# climb.io.files) does not load torch.
_EXPORTS = {
    "EOS_TOKEN": "tokenizer",
    "GPT": "model",
    "GPTConfig": "config",
    "MixtureSampler": "sampler",
    "Tokenizer": "tokenizer",
    "TokenStore": "tokens",
    "TrainConfig": "config",
    "atomic_path": "atomic",
    "bits_per_byte": "evaluate",
    "evaluate_task": "evaluate",
    "load_tasks": "evaluate",
    "load_tokenizer": "tokenizer",
    "lr_at": "train",
    "merge_token_stores": "tokens",
    "train": "train",
    "train_bpe": "tokenizer",
    "write_shard_tokens": "tokens",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    # Importing a submodule binds it to the package's attribute of that name: for
    # `proxies.train` that would hide the train function exported above. Keep the function.
    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}" and name in _EXPORTS:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
