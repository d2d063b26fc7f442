"""Tokenizer for the proxy models: byte-level BPE via HuggingFace ``tokenizers``.

``train_bpe`` trains a byte-level BPE (GPT-2 style pre-tokenization, every byte in
the base alphabet so any text round-trips, ``<|endoftext|>`` as the only special
token) from an iterator of texts and saves it as ``tokenizer.json``.
``load_tokenizer`` reads such a file back (or a ``.tiktoken`` rank file when the
optional ``tiktoken`` package is installed).

Usage::

    from proxies.tokenizer import train_bpe, load_tokenizer
    tok = train_bpe(texts, vocab_size=8192, path="runs/x/tokenizer.json")
    tok = load_tokenizer("runs/x/tokenizer.json")
    ids = tok.encode("héllo") ; tok.decode(ids) == "héllo"

Tested by ``pytest tests/test_proxies_data.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from .atomic import atomic_path

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
# Checked in order when loading a foreign tokenizer.json that may name its EOS differently.
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
# o200k / cl100k-style split pattern; a .tiktoken file stores ranks only, not the regex.
_TIKTOKEN_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)


# A long document is encoded in pieces of about PIECE_CHARS characters, CALL_CHARS
# characters a call at most: a 20 MB document in one call held gigabytes of token objects.
PIECE_CHARS = 1 << 16
CALL_CHARS = 1 << 22


def split_long(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` in pieces of at most `size` characters, each cut just before a single space
    between two other characters (where the byte-level and tiktoken pre-tokenizers always
    split, so the pieces' ids joined are the whole text's); with no such space in the last
    half of a window, the cut falls at `size`."""
    if len(text) <= size:
        return [text]
    out, start = [], 0
    while len(text) - start > size:
        end = start + size
        i = text.rfind(" ", start + size // 2, end)
        while i > start and (text[i - 1].isspace() or text[i + 1].isspace()):
            i = text.rfind(" ", start + size // 2, i)
        cut = i if i > start else end
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def encode_arrays(tokenizer, texts: Sequence[str], dtype) -> list[np.ndarray]:
    """The ids of each text as an array of `dtype`, from any tokenizer with `encode_batch`: long
    texts are encoded in pieces, at most CALL_CHARS characters a call, so memory stays bounded
    whatever a text's length."""
    out: list[list[np.ndarray]] = [[] for _ in texts]
    group: list[str] = []
    owner: list[int] = []
    size = 0

    def run() -> None:
        for k, ids in zip(owner, tokenizer.encode_batch(group)):
            out[k].append(np.asarray(ids, dtype=dtype))
        group.clear()
        owner.clear()

    for k, text in enumerate(texts):
        for piece in split_long(text):
            if size + len(piece) > CALL_CHARS and group:
                run()
                size = 0
            group.append(piece)
            owner.append(k)
            size += len(piece)
    if group:
        run()
    return [np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty(0, dtype)
            for parts in out]


def _pad64(n: int) -> int:
    return ((n + 63) // 64) * 64


class Tokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer`` with an EOS id and padded vocab size."""

    def __init__(self, hf: HFTokenizer, eos_token: str | None = None, source: str = "<memory>") -> None:
        self._hf = hf
        self.source = source
        names = (eos_token,) if eos_token else _EOS_CANDIDATES
        for name in names:
            tid = hf.token_to_id(name)
            if tid is not None:
                self.eos_token, self._eos_id = name, tid
                break
        else:
            raise ValueError(
                f"tokenizer {source} has no end-of-text token (looked for {list(names)}); "
                f"retrain it with proxies.tokenizer.train_bpe or add {EOS_TOKEN!r} as a special token"
            )

    @property
    def raw_vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """Embedding-table size: the real vocabulary padded up to a multiple of 64."""
        return _pad64(self.raw_vocab_size)

    @property
    def eos_id(self) -> int:
        return self._eos_id

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts using the library's multi-threaded (Rust/rayon) batch path."""
        texts = list(texts)
        fast = getattr(self._hf, "encode_batch_fast", None)  # skips offsets; tokenizers >= 0.20
        encs = (fast or self._hf.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Sequence[int]) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | Path) -> Path:
        """Write tokenizer.json to ``path`` (a file, or a directory to put tokenizer.json in)."""
        path = _resolve_json_path(path, for_write=True)
        with atomic_path(path) as tmp:
            self._hf.save(str(tmp))
        return path

    def __repr__(self) -> str:
        return f"Tokenizer(source={self.source!r}, vocab={self.raw_vocab_size}->{self.vocab_size}, eos={self.eos_id})"


class TiktokenTokenizer(Tokenizer):
    """Same interface over a ``tiktoken.Encoding`` (for ``.tiktoken`` rank files)."""

    def __init__(self, enc, source: str) -> None:  # noqa: D401 - no HF object here
        self._enc = enc
        self.source = source
        self.eos_token = EOS_TOKEN
        self._eos_id = enc.encode_single_token(EOS_TOKEN)

    @property
    def raw_vocab_size(self) -> int:
        return self._enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_batch(list(texts), disallowed_special=())

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def save(self, path: str | Path) -> Path:
        raise NotImplementedError(
            f"cannot re-save a tiktoken tokenizer; copy the original file {self.source} instead"
        )


def _resolve_json_path(path: str | Path, for_write: bool = False) -> Path:
    p = Path(path)
    if p.is_dir() or (for_write and p.suffix == ""):
        return p / "tokenizer.json"
    return p


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | Path) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` entries (incl. 256 bytes and EOS) and save it."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
            f"{len(alphabet) + 1} (256 bytes + {EOS_TOKEN})"
        )
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    tok = Tokenizer(hf, eos_token=EOS_TOKEN, source=str(path))
    saved = tok.save(path)
    tok.source = str(saved)
    logger.info("trained byte-level BPE: %d tokens, saved to %s", tok.raw_vocab_size, saved)
    return tok


def load_tokenizer(path: str | Path, eos_token: str | None = None) -> Tokenizer:
    """Load a HF ``tokenizer.json`` (file or directory holding one) or a ``.tiktoken`` file."""
    p = _resolve_json_path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"tokenizer file {p} not found; train one with proxies.tokenizer.train_bpe(...) "
            "or pass the path of an existing tokenizer.json"
        )
    if p.suffix == ".tiktoken":
        return _load_tiktoken(p)
    try:
        hf = HFTokenizer.from_file(str(p))
    except Exception as e:  # the Rust side raises a bare Exception on bad JSON
        raise ValueError(
            f"could not read {p} as a HuggingFace tokenizers tokenizer.json ({e}); "
            "regenerate it with proxies.tokenizer.train_bpe or tokenizer.save(...)"
        ) from e
    return Tokenizer(hf, eos_token=eos_token, source=str(p))


def _load_tiktoken(p: Path) -> Tokenizer:
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError as e:
        raise ImportError(
            f"{p} is a .tiktoken file but the optional 'tiktoken' package is not installed; "
            "pip install tiktoken, or use a HuggingFace tokenizer.json instead"
        ) from e
    try:
        ranks = load_tiktoken_bpe(str(p))
    except Exception as e:
        raise ValueError(f"could not parse {p} as a .tiktoken rank file ({e})") from e
    enc = tiktoken.Encoding(
        name=p.stem,
        pat_str=_TIKTOKEN_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOS_TOKEN: len(ranks)},
    )
    return TiktokenTokenizer(enc, source=str(p))
