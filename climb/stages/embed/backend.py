"""The embedding backend: plain sentence-transformers on torch, or its transformer run by OpenVINO.

`embed.backend = "auto"` picks OpenVINO on a CPU and torch elsewhere (CUDA, MPS); on a CPU
a corpus of `climb.stages.embed.AUTO_TUNED_DOCS` documents or more goes to the TF-IDF
student instead (the embed stage decides that, knowing the corpus: `embed.resolved`).
On this project's CPU the OpenVINO path (bf16) embeds faster than a
plain fp32 `SentenceTransformer.encode`, with near-identical embeddings (see
BENCHMARKS.md, Stage speed). Only the transformer changes hands: the
SentenceTransformer keeps its tokenizer, length-sorted batching, pooling and
normalisation, so `encode` behaves as before.

The OpenVINO model is converted locally from the loaded torch weights (nothing is
fetched) with OpenVINO's own `convert_model`, once per model, and cached under
`$HF_HOME/climb/openvino/<model>-<hash>/` (the hash covers the weights, the config
and the library versions). A file lock and a rename into place let concurrent runs
and Dask workers share the cache. Before it is used, the converted model must
agree with torch on a few probe texts (cosine >= 0.99); under `auto` a model that
cannot be converted or does not agree falls back to torch with a warning.

sentence-transformers' own `backend="onnx"` / `"openvino"` need optimum-onnx, whose
release pins transformers below 4.58 (sentence-transformers 6 needs 5.x), or
optimum-intel, which pins transformers below 5.6 and pulls torchvision (a CUDA torch
with it) and nncf; hence this small adapter on the openvino package alone.

    from climb.stages.embed.backend import resolve_backend
    resolve_backend("auto", "cpu")  # "openvino" where it is installed, else "torch"
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from climb.config import EMBED_BACKENDS as BACKENDS

log = logging.getLogger(__name__)
AGREEMENT = 0.99  # minimum cosine with torch fp32 on the probe texts
_PROBES = [
    "climb finds the data mixture to pretrain a language model on.",
    "def embed(texts):\n    return model.encode(texts, normalize_embeddings=True)",
    # Longer than any window: exercises truncation and padding in one batch.
    " ".join(["The quarterly results beat expectations as broadband and mobile revenue grew."] * 60),
]


@contextlib.contextmanager
def _no_telemetry():
    # OpenVINO reports usage (on import and on every conversion) to its vendor unless
    # the user opted out or CI=true; climb uses it on the user's behalf, so it never reports.
    old = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = old


def _openvino():
    """The openvino module, imported without telemetry (every import here goes through this)."""
    with _no_telemetry():
        import openvino
    return openvino


def openvino_available() -> bool:
    try:
        _openvino()
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, device: str) -> str:
    """The backend that runs: OpenVINO for "auto" on a CPU (where installed), torch on anything else;
    "static" and "tuned" as asked. ("auto" on a large corpus is made "tuned" before this, by
    the embed stage's `resolved`.)"""
    if backend not in BACKENDS:
        raise ValueError(f"embed.backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        return "openvino" if device == "cpu" and openvino_available() else "torch"
    if backend in ("static", "tuned"):
        return backend  # numpy on the CPU, whatever the device
    if backend == "openvino":
        if device != "cpu":
            raise ValueError(f"embed.backend=\"openvino\" runs on the CPU, but embed.device resolved to {device!r}; "
                             "set embed.device=\"cpu\" or embed.backend=\"auto\"")
        if not openvino_available():
            raise ValueError("embed.backend=\"openvino\" needs the openvino package: pip install openvino")
    return backend


def cache_root() -> Path:
    """Where converted models live: $HF_HOME/climb (HF_HOME defaults as the Hub's does)."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(hf_home).expanduser() / "climb"


def precision_hint(dtype: str) -> str:
    """OpenVINO's inference precision for embed.dtype ("auto": bf16 where the CPU has AMX)."""
    if dtype == "auto":
        from climb.runtime.device import cpu_has_bf16
        return "bf16" if cpu_has_bf16() else "f32"
    table = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
    if dtype not in table:
        raise ValueError(f"dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return table[dtype]


def _transformer(st):
    """The sentence-transformers Transformer module and the attribute holding its HF model."""
    first = st[0]
    for attr in ("model", "auto_model"):  # sentence-transformers >= 6, and before
        if isinstance(getattr(first, attr, None), torch.nn.Module) and attr in first._modules:
            return first, attr
    raise ValueError(f"the first module of this model is a {type(first).__name__}, not a transformer")


def _model_key(hf_model, inputs: list[str]) -> str:
    import transformers
    openvino = _openvino()
    h = hashlib.sha256()
    h.update(json.dumps([openvino.__version__, torch.__version__, transformers.__version__, inputs]).encode())
    h.update(hf_model.config.to_json_string().encode())
    for name, t in hf_model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class _Encoder(torch.nn.Module):
    """The HF model reduced to what is converted: token ids in, last hidden state out."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state


def convert(hf_model, example: dict):
    """OpenVINO model of `hf_model` (dynamic batch and length), from its torch weights."""
    ov = _openvino()
    shapes = [(name, [-1, -1], ov.Type.i64) for name in example]
    from transformers.utils import logging as hf_logging

    # Tracing warns about data-dependent branches (the probe check then verifies the
    # result) and transformers about config fields it does not use: quiet here.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.no_grad(), _no_telemetry(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ov.convert_model(_Encoder(hf_model).eval(), example_input=example, input=shapes)
    finally:
        hf_logging.set_verbosity(verbosity)


def cache_slug(name: str) -> str:
    """A model's name as a cache folder name (its last path part, safe characters only)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name.rstrip("/")).name)[-60:] or "model"


def build_once(final: Path, done: str, write: Callable[[Path], None], what: str) -> Path:
    """The cache folder `final`, built once: `write(folder)` fills a temporary folder under a
    file lock, which is then renamed into place; `final/done` marks a finished build, and a
    build another process finished while this one waited is reused."""
    from filelock import FileLock
    if (final / done).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / done).exists():
            return final
        log.info("embed: %s (once; cached in %s)", what, final)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        shutil.rmtree(final, ignore_errors=True)  # a folder left without its `done` file
        os.replace(tmp, final)
    return final


def cached_model(hf_model, example: dict, name: str):
    """The converted model from the cache, converting (once, under a lock) on a miss.
    Returns an `openvino.Model`, or the path of its cached IR."""
    ov = _openvino()
    final = cache_root() / "openvino" / f"{cache_slug(name)}-{_model_key(hf_model, list(example))}"

    def write(folder: Path) -> None:
        ov.save_model(convert(hf_model, example), str(folder / "model.xml"), compress_to_fp16=False)
        (folder / "source.json").write_text(json.dumps({"model": name, "inputs": list(example),
                                                        "openvino": ov.__version__}) + "\n")
    try:
        return build_once(final, "model.xml", write, f"converting {name} to OpenVINO") / "model.xml"
    except OSError as e:  # a read-only cache: convert in memory, every time
        log.warning("embed: cannot cache the OpenVINO model under %s (%s); converting it in memory", final, e)
        return convert(hf_model, example)


class OpenVINOTransformer(torch.nn.Module):
    """Stands in for the HF model inside a SentenceTransformer: runs the compiled OpenVINO model."""

    def __init__(self, compiled, config) -> None:
        super().__init__()
        self.compiled, self.config = compiled, config
        self.inputs = [i.any_name for i in compiled.inputs]

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **_):
        from transformers.modeling_outputs import BaseModelOutput
        given = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)}
        feeds = {k: np.ascontiguousarray(given[k].cpu().numpy(), dtype=np.int64) for k in self.inputs}
        # One request per call: a compiled model's own request is not safe across threads.
        out = self.compiled.create_infer_request().infer(feeds)[self.compiled.outputs[0]]
        return BaseModelOutput(last_hidden_state=torch.from_numpy(np.array(out, dtype=np.float32)))


def to_openvino(st, name: str, dtype: str) -> None:
    """Swap the transformer of the fp32 torch SentenceTransformer `st` for its OpenVINO
    conversion, in place. Raises when it cannot be converted or does not agree with torch."""
    ov = _openvino()
    module, attr = _transformer(st)
    hf_model = getattr(module, attr)
    ref = st.encode(_PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    feats = st.tokenizer(_PROBES[:2], padding=True, truncation=True, max_length=st.max_seq_length,
                         return_tensors="pt")
    example = {k: feats[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in feats}
    source = cached_model(hf_model, example, name)
    hint = precision_hint(dtype)
    threads = torch.get_num_threads()  # what this process allows (1 in climb's worker processes)
    compiled = ov.Core().compile_model(source if isinstance(source, ov.Model) else str(source), "CPU",
                                       {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                                        "INFERENCE_NUM_THREADS": threads})
    setattr(module, attr, OpenVINOTransformer(compiled, hf_model.config))
    got = st.encode(_PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    cos = float((ref * got).sum(1).min())
    if not cos >= AGREEMENT:
        setattr(module, attr, hf_model)
        raise ValueError(f"the OpenVINO conversion of {name} disagrees with torch (min cosine {cos:.4f} "
                         f"< {AGREEMENT}); use embed.backend=\"torch\"")
    st.climb_backend = f"openvino-{hint}"
    log.info("embed: %s on OpenVINO (%s, %d threads; cosine with torch fp32 on probes %.4f)",
             name, hint, threads, cos)
