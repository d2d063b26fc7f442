"""target.lm_eval: a trained proxy scored through the LM Evaluation Harness and through climb's own
evaluator on one local PIQA-style file gives the same accuracy, acc_norm and gold loss per byte;
bad tasks fail before any stage; a Hugging Face checkpoint is scored with the harness's `hf` model.
Skipped without lm-eval (`pip install 'climb[harness]'`; `.ci/run` installs it)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from climb.config import TargetConfig, load_config, to_toml
from climb.io.files import InputError

pytest.importorskip("lm_eval")

ITEMS = [  # PIQA's shape: a "Question:" query, two choices, the gold index; a few not ASCII
    {"query": "Question: How do I keep bread fresh?\n", "choices": ["Wrap it in a cloth bag.", "Soak it in water."],
     "gold": 0},
    {"query": "Question: How to make a café au lait?", "choices": ["Mix coffee and hot milk.", "Freeze the milk."],
     "gold": 0},
    {"query": "Question: What opens a jar lid that sticks?", "choices": ["Tap the lid gently.", "Paint the jar."],
     "gold": 0},
    {"query": "Question: How to dry wet shoes?", "choices": ["Put them in the oven on high.",
                                                              "Stuff them with newspaper."], "gold": 1},
    {"query": "Question: Where should naïve plants go?", "choices": ["In the sun.", "In a drawer."], "gold": 0},
]
CLOZE = [{"context": "The quick brown fox jumps over the lazy", "continuation": " dog"},
         {"context": "One, two, three, four,", "continuation": " five"}]


def _task_files(tmp_path):
    (tmp_path / "piqa_local.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ITEMS))
    (tmp_path / "cloze_local.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CLOZE))
    (tmp_path / "piqa_local.yaml").write_text(f"""task: piqa_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / 'piqa_local.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    (tmp_path / "cloze_local.yaml").write_text(f"""task: cloze_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / 'cloze_local.jsonl'}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
  - metric: acc
""")
    return tmp_path / "piqa_local.yaml", tmp_path / "cloze_local.yaml"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """A small proxy trained on text like the items', and its tokenizer."""
    from proxies.model import GPT, GPTConfig
    from proxies.tokenizer import train_bpe
    d = tmp_path_factory.mktemp("proxy")
    texts = [it["query"] + " " + c for it in ITEMS for c in it["choices"]] * 20 + [c["context"] + c["continuation"]
                                                                               for c in CLOZE] * 20
    tok = train_bpe(iter(texts), 320, d / "tok.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32, seq_len=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = [tok.eos_id] + [i for t in texts for i in tok.encode(t) + [tok.eos_id]]
    data = torch.tensor(ids[: (len(ids) // 33) * 33]).view(-1, 33)
    for step in range(60):
        batch = data[torch.randint(0, len(data), (16,))]
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), tok


def test_the_harness_and_climbs_evaluator_agree_on_a_local_piqa_file(proxy, tmp_path):
    from climb.runtime.harness import score_proxy
    from proxies.evaluate import evaluate_task
    model, tok = proxy
    piqa, cloze = _task_files(tmp_path)
    got = score_proxy(model, tok, TargetConfig(lm_eval=(str(piqa), str(cloze))), "cpu")
    ours = evaluate_task(model, tok, ITEMS)
    assert got["piqa_local/acc"] == pytest.approx(ours["acc"], abs=1e-9)
    assert got["piqa_local/acc_norm"] == pytest.approx(ours["acc_norm"], abs=1e-9)
    assert got["piqa_local/gold_loss_per_byte"] == pytest.approx(ours["gold_loss_per_byte"], rel=1e-6)
    cl = evaluate_task(model, tok, CLOZE)
    assert got["cloze_local/gold_loss_per_byte"] == pytest.approx(cl["gold_loss_per_byte"], rel=1e-6)
    assert got["cloze_local/acc"] == pytest.approx(cl["acc"], abs=1e-9)  # greedy hits, as ours
    assert np.isfinite(got["cloze_local/perplexity"]) and got["cloze_local/perplexity"] > 1
    assert 0 < ours["gold_loss_per_byte"] < np.log(tok.vocab_size)  # trained: below a uniform guess per byte


def test_rolling_loglikelihood_is_every_token_once(proxy):
    """loglikelihood_rolling over a text longer than the context: each token predicted once, in
    windows of seq_len predictions (after EOS, then after one token of context; the last window
    takes what context fits), as the harness's own models do."""
    from lm_eval.api.instance import Instance

    from climb.runtime.harness import proxy_lm
    from proxies.evaluate import score_token_pairs
    model, tok = proxy
    text = " ".join(it["query"] for it in ITEMS) * 3
    lm = proxy_lm(model, tok, "cpu")
    [got] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = tok.encode(text)
    assert len(ids) > 2 * model.config.seq_len
    T = model.config.seq_len
    pairs = [([tok.eos_id], ids[:T])]
    for s in range(T, len(ids), T):
        pred = ids[s:s + T]
        pairs.append((ids[s + len(pred) - T - 1:s], pred))
    assert sum(len(p) for _, p in pairs) == len(ids)
    want = sum(s[0] for s in score_token_pairs(model, pairs))
    assert got == pytest.approx(want, rel=1e-6)


def test_bad_tasks_fail_before_any_stage(tmp_path, monkeypatch):
    from climb import pipeline
    from climb.runtime import harness
    harness._CACHE.clear()
    with pytest.raises(InputError, match="knows no task 'no_such_task'"):
        harness.check(TargetConfig(lm_eval=("no_such_task",)))
    # A task the harness ships whose data is on the Hub: nothing is downloaded, one line says so.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match="cannot load") as e:
        harness.check(TargetConfig(lm_eval=("piqa",)))
    assert "\n" not in str(e.value)
    cfg = load_config(None, ["target.lm_eval=[\"no_such_task\"]", 'target.objective=["no_such_task/acc"]',
                             'target.goal="maximize"'])
    with pytest.raises(InputError, match="no_such_task"):
        pipeline.run_stage("search", cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "embed").exists()  # refused before the first stage


def test_a_hugging_face_checkpoint_is_scored_with_the_harness_hf_model(proxy, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, tok = proxy
    piqa, _ = _task_files(tmp_path)
    ckpt = tmp_path / "hf"
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok._hf, eos_token=tok.eos_token)
    fast.save_pretrained(ckpt)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64,
                                                                 n_embd=32, n_layer=1, n_head=2,
                                                                 eos_token_id=tok.eos_id, bos_token_id=tok.eos_id))
    model.save_pretrained(ckpt)
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(to_toml(load_config(None, [f'target.lm_eval=["{piqa}"]', 'target.objective=["piqa_local/acc"]',
                                                   'target.goal="maximize"'])))
    out = tmp_path / "metrics.json"
    r = subprocess.run([sys.executable, "-m", "climb.runtime.harness", "--hf", str(ckpt), "--config", str(cfg_file),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads(out.read_text())["metrics"]
    assert 0 <= metrics["piqa_local/acc"] <= 1 and metrics["piqa_local/gold_loss_per_byte"] > 0
