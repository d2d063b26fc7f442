"""Evaluate proxy models: bits-per-byte on held-out text and log-likelihood tasks.

``bits_per_byte`` streams the texts (each followed by EOS, the stream opened by
an EOS so every text token is predicted) through non-overlapping windows of
``seq_len`` predictions and divides the summed NLL by ln 2 times the UTF-8 bytes.

``evaluate_task`` scores JSON Lines tasks (see ``load_tasks``) the way the LM
Evaluation Harness scores multiple-choice and cloze tasks (tests/test_harness.py
checks it against the harness itself): context and continuation are tokenized
together and split where the context's own tokens end, trailing whitespace of the
context moved to the continuation (``encode_pair``, the harness's ``_encode_pair``),
the sequence truncated from the left to fit, and the log-likelihood of the
continuation tokens summed. Metrics: ``acc``, ``acc_norm`` (log-likelihood per
character of the choice, as the harness's), ``gold_loss_per_byte`` (the gold
continuation's loss in nats per UTF-8 byte: climb's own smooth signal) and ``n``.

The model only needs ``model.config.seq_len`` and ``model(idx) -> (logits, _)``,
and must already be on ``device``.

Precision: ``bf16`` says whether the forward passes run under bf16 autocast. The
caller decides, once, the way the trainers do (``proxies.train.uses_bf16(device,
precision, n_embd)``), so a model trained in fp32 is also scored in fp32. Left at
None it is the device's default: bf16 on CUDA, none elsewhere. Usage::

    from proxies.evaluate import bits_per_byte, load_tasks, evaluate_task
    from proxies.train import uses_bf16
    bf16 = uses_bf16(torch.device("cuda"), "fp32", 64)  # False
    bpb = bits_per_byte(model, tok, heldout_texts, device="cuda", bf16=bf16)
    metrics = evaluate_task(model, tok, load_tasks("tasks/arc_easy.jsonl"), device="cuda", bf16=bf16)

Tested by ``pytest tests/test_proxies_eval.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from .model import gather_logprobs

logger = logging.getLogger(__name__)


def inference_autocast(device: torch.device, bf16: bool | None = None):
    """The autocast context evaluation runs under: bf16 when ``bf16`` says so (None: on
    CUDA only, the default before callers passed their training precision), else none."""
    if bf16 is None:
        bf16 = device.type == "cuda"
    if bf16 and device.type in ("cuda", "cpu"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _inference(model: torch.nn.Module, device: torch.device, bf16: bool | None = None) -> Iterator[None]:
    was_training = model.training
    model.eval()
    autocast = inference_autocast(device, bf16)
    try:
        with torch.inference_mode(), autocast:
            yield
    finally:
        model.train(was_training)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _text_logprobs(model, tokenizer, texts: Sequence[str], device: torch.device, batch_size: int,
                   prepend_eos: bool, bf16: bool | None) -> Iterator[torch.Tensor]:
    """Per batch of windows, the log-probabilities (natural log, 0 at padding) the model gives
    the EOS-separated token stream of ``texts``, and the mask of real tokens: every token
    after the first is predicted exactly once."""
    eos = tokenizer.eos_id
    stream = [eos] if prepend_eos else []
    for ids in tokenizer.encode_batch(list(texts)):
        stream.extend(ids)
        stream.append(eos)
    ids = torch.tensor(stream, dtype=torch.long)
    T = model.config.seq_len
    n_pred = len(stream) - 1
    # Window i predicts stream[i*T+1 : i*T+T+1] from inputs stream[i*T : i*T+T].
    starts = list(range(0, n_pred, T))
    with _inference(model, device, bf16):
        for b in range(0, len(starts), batch_size):
            chunk = starts[b : b + batch_size]
            win = torch.full((len(chunk), T + 1), -1, dtype=torch.long)
            for row, s in enumerate(chunk):
                piece = ids[s : s + T + 1]
                win[row, : len(piece)] = piece
            win = _to_device(win, device)
            logits, _ = model(win[:, :-1].clamp_min(0))
            yield gather_logprobs(logits, win[:, 1:]), win[:, 1:] >= 0  # the last window's padding: 0, masked


def _text_bytes(texts: Sequence[str]) -> int:
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    if total_bytes == 0:
        raise ValueError("bits_per_byte needs at least one non-empty text")
    return total_bytes


def bits_per_byte(
    model,
    tokenizer,
    texts: Sequence[str],
    device="cpu",
    batch_size: int = 16,
    prepend_eos: bool = True,
    bf16: bool | None = None,
) -> float:
    """Total NLL of the EOS-separated token stream, in bits, per UTF-8 byte of ``texts``.

    ``bf16``: run under bf16 autocast (None: on CUDA only); see the module docstring."""
    texts = list(texts)
    total_bytes = _text_bytes(texts)
    nll = 0.0
    for lp, _ in _text_logprobs(model, tokenizer, texts, torch.device(device), batch_size, prepend_eos, bf16):
        nll -= lp.sum(dtype=torch.float64).item()
    return nll / (math.log(2) * total_bytes)


def token_logprobs(model, tokenizer, texts: Sequence[str], device="cpu", batch_size: int = 16,
                   prepend_eos: bool = True, bf16: bool | None = None) -> tuple[np.ndarray, int]:
    """The model's log-probability (natural log, float32) of every token ``bits_per_byte``
    scores, in stream order, and the texts' UTF-8 bytes: ``-logp.sum() / (ln 2 * bytes)``
    is their bits per byte. A mixture of models' probabilities scored this way gives the
    bits per byte of their ensemble (``climb.optimize.experts.ensemble_bpb``)."""
    texts = list(texts)
    total_bytes = _text_bytes(texts)
    parts = [lp[real].float().cpu().numpy() for lp, real in
             _text_logprobs(model, tokenizer, texts, torch.device(device), batch_size, prepend_eos, bf16)]
    return np.concatenate(parts).astype(np.float32), total_bytes


def load_tasks(path: str | Path) -> list[dict]:
    """Read a JSON Lines task file: multiple-choice {"query", "choices", "gold"} or
    cloze {"context", "continuation"} items. Blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} not found")
    with open(path, encoding="utf-8") as f:
        return parse_tasks(f, path)


def parse_tasks(lines: Iterable[str], source: str | Path) -> list[dict]:
    """Task items from the lines of a JSON Lines task file; `source` names it in errors."""
    items = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        items.append(_check_item(obj, where))
    if not items:
        raise ValueError(f"{source}: no task items found")
    return items


def _check_item(obj: dict, where: str) -> dict:
    if "choices" in obj:
        q, choices, gold = obj.get("query"), obj["choices"], obj.get("gold")
        if not isinstance(q, str):
            raise ValueError(f"{where}: multiple-choice item needs a string 'query'")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"{where}: 'choices' must be a non-empty list of strings")
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise ValueError(f"{where}: 'gold' must be an integer index into choices (0..{len(choices) - 1})")
        return obj
    if "continuation" in obj:
        if not isinstance(obj.get("context"), str) or not isinstance(obj["continuation"], str):
            raise ValueError(f"{where}: cloze item needs string 'context' and 'continuation'")
        if not obj["continuation"]:
            raise ValueError(f"{where}: cloze 'continuation' is empty")
        return obj
    raise ValueError(
        f"{where}: unrecognised item with keys {sorted(obj)}; expected "
        '{"query", "choices", "gold"} or {"context", "continuation"}'
    )


def mc_request(query: str, choice: str) -> tuple[str, str]:
    """(context, continuation) for one multiple-choice option."""
    if query.startswith("Question:"):
        # Queries that already end in "Answer:" are not given a second one.
        ctx = query.rstrip() if query.rstrip().endswith("Answer:") else query + "\nAnswer:"
        return ctx, choice if choice.startswith(" ") else " " + choice
    return query, choice


_WARNED: set = set()


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as the LM Evaluation Harness forms them: whitespace
    ending the context moves to the continuation, the two are tokenized together and the
    continuation's ids are those after the context's own; an empty context is EOS alone."""
    return encode_pairs(tokenizer, [(context, continuation)])[0]


def encode_pairs(tokenizer, requests: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """``encode_pair`` for many (context, continuation) requests, in two batched tokenizer calls."""
    eos = tokenizer.eos_id
    moved = []
    for context, continuation in requests:
        n = len(context) - len(context.rstrip()) if context else 0
        moved.append((context[:-n], context[-n:] + continuation) if n else (context, continuation))
    wholes = tokenizer.encode_batch([c + x for c, x in moved])
    ctxs = tokenizer.encode_batch([c for c, _ in moved])
    out = []
    for (c, x), whole, ctx in zip(moved, wholes, ctxs):
        if not c:  # an empty context is conditioned on EOS (a document start)
            out.append(([eos], whole))
        else:
            out.append((ctx, whole[len(ctx):]))
    return out


def score_requests(
    model,
    tokenizer,
    requests: Sequence[tuple[str, str]],
    device="cpu",
    batch_size: int = 32,
    bf16: bool | None = None,
    per_token: bool = False,
) -> list:
    """(sum log p(continuation | context), continuation is the greedy argmax) per request;
    with ``per_token``, instead each continuation token's log p (float32 array, in order).

    ``bf16``: run under bf16 autocast (None: on CUDA only); see the module docstring."""
    return score_token_pairs(model, encode_pairs(tokenizer, requests), device, batch_size, bf16, per_token)


def score_token_pairs(model, pairs: Sequence[tuple[list[int], list[int]]], device="cpu", batch_size: int = 32,
                      bf16: bool | None = None, per_token: bool = False) -> list:
    """``score_requests`` on requests already tokenized: (context ids, continuation ids) pairs."""
    device = torch.device(device)
    T = model.config.seq_len
    ctx_ids, cont_ids = [c for c, _ in pairs], [c for _, c in pairs]
    requests = pairs
    seqs, n_conts = [], []
    long = [len(c) for c in cont_ids if len(c) > T]
    if long:
        # Once per process and request set: every proxy of a search scores the same requests.
        key = (len(requests), T, len(long))
        if key not in _WARNED:
            _WARNED.add(key)
            logger.warning("%d of %d continuations exceed seq_len=%d tokens (longest %d); each is scored on "
                           "its last %d tokens", len(long), len(requests), T, max(long), T)
    for ctx, cont in zip(ctx_ids, cont_ids):
        seq = (ctx + cont)[-(T + 1) :]
        seqs.append(seq)
        n_conts.append(min(len(cont), len(seq) - 1))
    results: list = [np.zeros(0, np.float32) if per_token else (0.0, True)] * len(seqs)
    # Longest first, so each batch holds similar lengths and little padding.
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    with _inference(model, device, bf16):
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            L = max(len(seqs[i]) for i in idx) - 1
            if L <= 0:
                continue
            inp = torch.zeros((len(idx), L), dtype=torch.long)
            tgt = torch.full((len(idx), L), -1, dtype=torch.long)
            for row, i in enumerate(idx):
                s, n = seqs[i], n_conts[i]
                inp[row, : len(s) - 1] = torch.tensor(s[:-1])
                if n:
                    # Only continuation positions carry targets; context and padding stay -1.
                    tgt[row, len(s) - 1 - n : len(s) - 1] = torch.tensor(s[-n:])
            inp, tgt = _to_device(inp, device), _to_device(tgt, device)
            logits, _ = model(inp)
            if per_token:
                lp = gather_logprobs(logits, tgt).float().cpu()
                keep = (tgt >= 0).cpu()
                for row, i in enumerate(idx):
                    results[i] = lp[row][keep[row]].numpy()
                continue
            ll = gather_logprobs(logits, tgt).sum(dim=1, dtype=torch.float64)
            hit = ((logits.argmax(dim=-1) == tgt) | (tgt < 0)).all(dim=1)
            for i, v, h in zip(idx, ll.tolist(), hit.tolist()):
                results[i] = (float(v), bool(h))
    return results


def gold_token_logprobs(model, tokenizer, items: Sequence[dict], device="cpu", batch_size: int = 32,
                        bf16: bool | None = None) -> list[tuple[np.ndarray, int]]:
    """Per item, the log p of each token of its gold continuation, scored as ``evaluate_task``
    scores it, and the continuation's UTF-8 bytes: ``-logp.sum() / bytes`` is the item's term
    of ``gold_loss_per_byte`` (which is their mean over the items)."""
    requests = [mc_request(it["query"], it["choices"][it["gold"]]) if "choices" in it
                else (it["context"], it["continuation"]) for it in items]
    lps = score_requests(model, tokenizer, requests, device=device, batch_size=batch_size, bf16=bf16, per_token=True)
    return [(lp, max(1, len(cont.encode("utf-8")))) for lp, (_, cont) in zip(lps, requests)]


def evaluate_task(
    model,
    tokenizer,
    items: Sequence[dict],
    device="cpu",
    limit: int | None = None,
    batch_size: int = 32,
    bf16: bool | None = None,
) -> dict:
    """Score task items; returns {acc, acc_norm, gold_loss_per_byte, n}.

    Multiple choice: acc uses the summed log-likelihood, acc_norm divides it by the
    length of the choice in characters (the harness's). Cloze: acc (and acc_norm) is 1 when greedy
    decoding reproduces the continuation. gold_loss_per_byte is the gold
    continuation's NLL (nats) per UTF-8 byte of that continuation. ``bf16``: run under
    bf16 autocast (None: on CUDA only); see the module docstring.
    """
    items = list(items)[:limit] if limit is not None else list(items)
    if not items:
        raise ValueError("evaluate_task got no items")
    requests, spans = [], []
    for item in items:
        start = len(requests)
        if "choices" in item:
            requests.extend(mc_request(item["query"], c) for c in item["choices"])
        else:
            requests.append((item["context"], item["continuation"]))
        spans.append((start, len(requests)))
    scores = score_requests(model, tokenizer, requests, device=device, batch_size=batch_size, bf16=bf16)

    acc, acc_norm, gold_lpb = [], [], []
    for item, (a, b) in zip(items, spans):
        lls = np.array([s[0] for s in scores[a:b]])
        if "choices" in item:
            gold = item["gold"]
            choice_chars = np.array([max(1, len(c)) for c in item["choices"]])
            acc.append(float(np.argmax(lls) == gold))
            acc_norm.append(float(np.argmax(lls / choice_chars) == gold))
            gold_cont = requests[a + gold][1]
            gold_lpb.append(-lls[gold] / max(1, len(gold_cont.encode("utf-8"))))
        else:
            greedy = float(scores[a][1])
            acc.append(greedy)
            acc_norm.append(greedy)
            gold_lpb.append(-lls[0] / max(1, len(item["continuation"].encode("utf-8"))))
    return {
        "acc": float(np.mean(acc)),
        "acc_norm": float(np.mean(acc_norm)),
        "gold_loss_per_byte": float(np.mean(gold_lpb)),
        "n": len(items),
    }
