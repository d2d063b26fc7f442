"""The rules a run config must meet beyond its field types, checked when it is loaded.

Each broken rule raises a `ConfigError` that names the key and the fix. The
validation model (the validate stage's larger proxy) is derived and checked here
too, as are the run folder and an external trainer's command.
"""
from __future__ import annotations

from pathlib import Path

from climb.config.schema import (EMBED_BACKENDS, EMBED_STORE_DTYPES, EMBED_STUDENTS, SEARCH_ACQUISITIONS, SEARCH_FINALS,
                                 TRACK_BACKENDS, ConfigError, ProxyConfig, RunConfig, from_dict, to_dict)
from climb.config.objective import named_goal
from proxies.config import ConfigFieldError


def check_config(cfg: RunConfig) -> None:
    """Every rule a config must meet beyond its types; the first one broken raises a ConfigError
    naming the key and the fix."""
    if cfg.target.goal not in ("minimize", "maximize"):
        raise ConfigError(f"target.goal must be 'minimize' or 'maximize', got {cfg.target.goal!r}")
    _check_objective_terms(cfg)
    losses = [m for m in cfg.target.objective
              if m in ("bpb", "train_loss") or m.endswith("/gold_loss_per_byte")]
    if cfg.target.goal == "maximize" and losses and len(losses) == len(cfg.target.objective) \
            and not cfg.target.goals:
        raise ConfigError(f"target.goal = 'maximize', but target.objective {list(cfg.target.objective)} "
                          f"{'is a loss' if len(losses) == 1 else 'are losses'} (lower is better); "
                          "set target.goal = 'minimize'")
    if cfg.cluster.k < 2:
        raise ConfigError("cluster.k must be at least 2")
    if cfg.target.contamination < 0 or (cfg.target.decontaminate and cfg.target.contamination < 1):
        raise ConfigError(f"target.contamination is an n-gram length (13, as GPT-3's check; 0: no check), got "
                          f"{cfg.target.contamination}" + ("; target.decontaminate needs one" if
                                                           cfg.target.decontaminate else ""))
    if not 0 <= cfg.dedup.threshold <= 1:
        raise ConfigError(f"dedup.threshold is a cosine in [0, 1] (0: no near duplicates), got {cfg.dedup.threshold}")
    if cfg.dedup.neighbors < 1:
        raise ConfigError(f"dedup.neighbors must be at least 1, got {cfg.dedup.neighbors}")
    if not cfg.search.iterations or min(cfg.search.iterations) < 1:
        raise ConfigError("search.iterations must be a non-empty list of positive counts, e.g. [16, 8, 4]")
    if cfg.embed.backend not in EMBED_BACKENDS:
        raise ConfigError(f"embed.backend must be one of {', '.join(map(repr, EMBED_BACKENDS))}, got "
                          f"{cfg.embed.backend!r} (\"auto\": on a CPU the TF-IDF student from 600,000 documents up, OpenVINO below; torch on a GPU)")
    if cfg.embed.store_dtype not in EMBED_STORE_DTYPES:
        raise ConfigError(f"embed.store_dtype (the embedding files' element type) must be one of "
                          f"{', '.join(map(repr, EMBED_STORE_DTYPES))}, got {cfg.embed.store_dtype!r} "
                          "(the model's own precision is embed.dtype: auto, fp32, fp16, bf16)")
    if cfg.embed.tune_sample < 100:
        raise ConfigError(f"embed.tune_sample must be at least 100 documents (the \"tuned\" student learns from "
                          f"them), got {cfg.embed.tune_sample}")
    if cfg.embed.student not in EMBED_STUDENTS:
        raise ConfigError(f"embed.student (what embed.backend=\"tuned\" trains) must be one of "
                          f"{', '.join(map(repr, EMBED_STUDENTS))}, got {cfg.embed.student!r}")
    if cfg.executor.kind not in ("local", "dask"):
        raise ConfigError(f"executor.kind must be 'local' or 'dask', got {cfg.executor.kind!r}")
    if cfg.search.eval_seeds < 2:
        raise ConfigError(f"search.eval_seeds must be at least 2 (paired seeds give the comparison its interval), "
                          f"got {cfg.search.eval_seeds}")
    unknown = set(cfg.search.baselines) - {"uniform", "natural", "one-shot"}
    if unknown:
        raise ConfigError(f"search.baselines: unknown {sorted(unknown)}; choose from uniform, natural, one-shot")
    if cfg.search.halving and (len(cfg.search.halving) != 2 or not all(0 < v < 1 for v in cfg.search.halving)):
        raise ConfigError(f"search.halving must be [rung, keep], two fractions in (0, 1) (e.g. [0.25, 0.25]), "
                          f"or [] for off; got {list(cfg.search.halving)}")
    if not 0 <= cfg.search.experts <= 1:
        raise ConfigError(f"search.experts is the fraction of the proxies' steps an expert trains, in [0, 1] "
                          f"(0: no experts); got {cfg.search.experts}")
    if not 0 <= cfg.search.base < 1:
        raise ConfigError(f"search.base is the fraction of the proxies' steps the shared base trains, in [0, 1) "
                          f"(0: no base); got {cfg.search.base}")
    if cfg.search.base and round(cfg.search.base * cfg.proxy.steps) < 1:
        raise ConfigError(f"search.base = {cfg.search.base} of proxy.steps = {cfg.proxy.steps} is no step; "
                          "raise it or set 0")
    if cfg.search.merge and (cfg.search.merge_pool < 1 or cfg.search.merge_tokens < 1):
        raise ConfigError(f"search.merge_pool and search.merge_tokens must be at least 1, got "
                          f"{cfg.search.merge_pool} and {cfg.search.merge_tokens}")
    if cfg.search.merge and not cfg.search.base:
        raise ConfigError("search.merge merges continuations of the shared base; set search.base too (e.g. 0.5)")
    if cfg.search.base and (cfg.search.halving or cfg.search.experts):
        raise ConfigError("search.base does not combine with search.halving or search.experts yet; "
                          "use search.merge for features from the base")
    if cfg.proxy.command:  # the command itself first, then what it cannot do
        check_command(cfg.proxy.command)
    if cfg.search.merge and (cfg.proxy.command or cfg.proxy.lookup):
        raise ConfigError("search.merge averages the weights of the built-in trainer's models; unset "
                          "proxy.command / proxy.lookup or turn it off")
    if cfg.search.base and cfg.proxy.lookup:
        raise ConfigError("search.base continues a trained base, but proxy.lookup trains nothing; turn one off")
    if (cfg.search.halving or cfg.search.experts) and (cfg.proxy.command or cfg.proxy.lookup):
        raise ConfigError("search.halving and search.experts need the built-in proxy trainer (they pause and "
                          "resume proxies, or read their token probabilities); unset proxy.command / proxy.lookup "
                          "or turn them off")
    if cfg.search.reuse_sharpen and not cfg.search.reuse_sharpen > 1:
        raise ConfigError(f"search.reuse_sharpen must be 0 (off) or above 1 (the largest power the earlier "
                          f"mixture is raised to), not {cfg.search.reuse_sharpen}")
    if cfg.search.reuse and (cfg.search.halving or cfg.search.experts or cfg.search.merge):
        raise ConfigError("search.reuse does not combine with search.halving, search.experts or search.merge yet "
                          "(the earlier run's evidence takes the place of their feature); turn them off")
    bad = [m for m in cfg.target.objective if m != "bpb" and not (
        m.endswith("/gold_loss_per_byte") and m.rsplit("/", 1)[0] in cfg.target.tasks)]
    if cfg.search.experts and bad:
        raise ConfigError(f"search.experts scores mixtures by the experts' ensemble loss, so every term of "
                          f"target.objective must be bpb or <task>/gold_loss_per_byte of a task in target.tasks; "
                          f"{bad} is not")
    if cfg.search.replicates < 0 or cfg.search.replicate_seeds < 0:
        raise ConfigError("search.replicates and search.replicate_seeds must be >= 0")
    if cfg.executor.processes < 0:
        raise ConfigError(f"executor.processes must be >= 0 (0: one per core on a CPU), got {cfg.executor.processes}")
    if not cfg.executor.dask_connect_timeout_s > 0:
        raise ConfigError("executor.dask_connect_timeout_s must be positive, got "
                          f"{cfg.executor.dask_connect_timeout_s}")
    if cfg.proxy.swarm_size < 0:
        raise ConfigError(f"proxy.swarm_size must be >= 0 (0: automatic), got {cfg.proxy.swarm_size}")
    _at_least(cfg, 1, "proxy.vocab_size", "proxy.tokenizer_docs", "search.eval_seeds", "search.pool_size",
              "cluster.niter", "cluster.sample_size", "corpus.batch_rows", "embed.batch_size",
              "embed.max_seq_length", "export.rows_per_shard", "executor.dask_workers",
              "executor.dask_threads_per_worker")
    _at_least(cfg, 0, "target.task_limit",
              "proxy.curve_points", "proxy.curve_evals", "proxy.timeout_s", "export.token_budget", "corpus.max_shards",
              "search.final_top_k", "search.final_kl", "search.steadiness_boot", "search.finalists", "export.weight_tolerance", "executor.dask_resource_grace_s")
    _check_model(cfg.proxy, "proxy")
    if not 0 <= cfg.search.min_weight < 1:
        raise ConfigError(f"search.min_weight is the least weight a cluster may get, in [0, 1) and at most "
                          f"1 / (number of clusters); got {cfg.search.min_weight}")
    if not cfg.search.concentrations or not all(c > 0 for c in cfg.search.concentrations):
        raise ConfigError("search.concentrations must be a non-empty list of positive Dirichlet concentrations, "
                          f"e.g. [0.1, 0.3, 1.0]; got {list(cfg.search.concentrations)}")
    if cfg.search.final_noise not in ("fitted", "measured"):
        raise ConfigError(f"search.final_noise is \"fitted\" or \"measured\", got {cfg.search.final_noise!r}")
    if cfg.search.final_noise == "measured" and (cfg.search.replicates < 2 or cfg.search.replicate_seeds < 1):
        raise ConfigError("search.final_noise = \"measured\" reads the seed noise off the run's replicates: it needs "
                          f"search.replicates >= 2 and search.replicate_seeds >= 1 (got {cfg.search.replicates} and "
                          f"{cfg.search.replicate_seeds})")
    if cfg.search.finalists and not 0 < cfg.search.finalists <= cfg.search.iterations[-1]:
        raise ConfigError(f"search.finalists trains the last iteration's {cfg.search.iterations[-1]} proxies on that "
                          f"many measured mixtures again, so it is 0 (off) or between 1 and "
                          f"{cfg.search.iterations[-1]}; got {cfg.search.finalists}")
    if cfg.search.finalists and (cfg.search.reuse or cfg.search.candidates):
        raise ConfigError("search.finalists does not combine with search.reuse or search.candidates yet; "
                          "set search.finalists = 0")
    if cfg.search.finalists and len(cfg.search.iterations) < 2:
        raise ConfigError("search.finalists needs an iteration before the last one to choose finalists from; "
                          "set search.iterations to two or more iterations, or search.finalists = 0")
    if not 0 <= cfg.search.target_prior <= 1:
        raise ConfigError(f"search.target_prior is the share of the candidate pool drawn around the clusters the "
                          f"target reads like, in [0, 1]; got {cfg.search.target_prior}")
    if not cfg.search.temperature >= 0:
        raise ConfigError(f"search.temperature must be >= 0 (0: around uniform, 1: around the token shares), "
                          f"got {cfg.search.temperature}")
    if not cfg.proxy.tokenizer and not cfg.proxy.lookup and cfg.proxy.vocab_size < 257:
        raise ConfigError(f"proxy.vocab_size = {cfg.proxy.vocab_size} is too small for the byte-level BPE the "
                          "tokenize stage trains: it needs at least 257 (256 bytes and the end-of-text token)")
    if not 0 < cfg.search.epoch_cap:
        raise ConfigError(f"search.epoch_cap must be positive, got {cfg.search.epoch_cap}")
    if cfg.export.format not in ("parquet", "megatron", "both"):
        raise ConfigError(f"export.format must be \"parquet\", \"megatron\" or \"both\", got {cfg.export.format!r}")
    if cfg.export.format != "parquet" and cfg.export.tokenizer in ("", "bytes"):
        raise ConfigError("export.format = \"megatron\" writes your trainer's token ids: set export.tokenizer to its "
                          "tokenizer.json (or a folder or installed model holding one)")
    if cfg.export.long_docs not in ("truncate", "skip"):
        raise ConfigError(f"export.long_docs must be 'truncate' or 'skip', got {cfg.export.long_docs!r}")
    if bool(cfg.proxy.lookup) != bool(cfg.proxy.lookup_weights):
        raise ConfigError("proxy.lookup (metrics CSV) and proxy.lookup_weights (weights CSV) go together; set both")
    if cfg.search.acquisition not in SEARCH_ACQUISITIONS:
        raise ConfigError(f"search: unknown acquisition {cfg.search.acquisition!r}; choose one of: "
                          f"{', '.join(SEARCH_ACQUISITIONS)}")
    if cfg.search.final not in SEARCH_FINALS:
        raise ConfigError(f"search: unknown final pick {cfg.search.final!r}; choose one of: "
                          f"{', '.join(SEARCH_FINALS)}")
    check_bounds(cfg.search)
    if cfg.search.candidates and cfg.search.final_top_k > 1:
        raise ConfigError("search.final_top_k > 1 averages mixtures, which leaves the candidate set "
                          "search.candidates; use 1")
    _check_validate(cfg)
    _check_tokenize(cfg)
    _check_track(cfg)


def _check_objective_terms(cfg: RunConfig) -> None:
    """target.weights and target.goals: each names a metric of target.objective, each weight is a
    number above 0, each goal minimize or maximize; with goals, no loss is maximized nor an accuracy
    minimized (without them, a mean of mixed metrics under one goal is allowed, as it always was)."""
    t = cfg.target
    for field, given in (("weights", t.weights), ("goals", t.goals)):
        extra = [m for m in given if m not in t.objective]
        if extra:
            raise ConfigError(f"target.{field} names {extra}, which target.objective {list(t.objective)} does not; "
                              "add them to target.objective or drop them")
    for m, w in t.weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0 or w == float("inf"):
            raise ConfigError(f"target.weights: the weight of {m!r} must be a number above 0, got {w!r}")
    for m, g in t.goals.items():
        if g not in ("minimize", "maximize"):
            raise ConfigError(f"target.goals: the goal of {m!r} must be 'minimize' or 'maximize', got {g!r}")
    for m in t.objective if t.goals else ():  # per-metric goals: each one's goal, own or target.goal, must fit it
        g = t.goals.get(m, t.goal)
        if named_goal(m) not in (None, g):
            kind = "a loss (lower is better)" if named_goal(m) == "minimize" else "an accuracy (higher is better)"
            raise ConfigError(f"target.objective: {m!r} is {kind}, but its goal is {g!r}"
                              f"{'' if m in t.goals else ' (target.goal)'}; set target.goals.{m} = "
                              f"'{named_goal(m)}'")


BOUND_KINDS = ("cluster", "source")


def parse_bound(key: str, value) -> tuple[str, str, float, float]:
    """One entry of search.bounds as (kind, name, min, max): "cluster:<i>" or "source:<name>", and a
    share (a pin: min = max) or [min, max], each in [0, 1]."""
    kind, _, name = str(key).partition(":")
    if kind not in BOUND_KINDS or not name.strip() or (kind == "cluster" and not name.isdigit()):
        raise ConfigError(f"search.bounds: key {key!r} must be \"cluster:<index>\" (e.g. \"cluster:3\") or "
                          f"\"source:<name>\" (e.g. \"source:code\")")
    pair = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(pair) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair):
        raise ConfigError(f"search.bounds.{key!r}: expected a share (a pin, e.g. 0.1) or [min, max] "
                          f"(e.g. [0.05, 0.3]), got {value!r}")
    lo, hi = float(pair[0]), float(pair[1])
    if not (0 <= lo <= 1 and 0 <= hi <= 1):
        raise ConfigError(f"search.bounds.{key!r}: shares lie in [0, 1], got {value!r}")
    if lo > hi:
        raise ConfigError(f"search.bounds.{key!r}: min {lo:g} is above max {hi:g}")
    return kind, name.strip(), lo, hi


def check_bounds(search_cfg) -> None:
    """search.bounds and search.kl_max as far as the config alone tells: well-formed entries, and
    minimums (pins count) that leave room for a mixture. Whether the corpus's clusters and sources
    can meet them is checked before the search (climb.stages.search.common.check_bounds)."""
    if not search_cfg.kl_max >= 0:
        raise ConfigError(f"search.kl_max is a KL divergence from the natural mixture in nats (0: off), "
                          f"so >= 0; got {search_cfg.kl_max}")
    floors: dict[str, float] = {}
    for key, value in search_cfg.bounds.items():
        kind, name, lo, hi = parse_bound(key, value)
        floors[kind] = floors.get(kind, 0.0) + lo
        if kind == "cluster" and 0 < lo and hi < search_cfg.min_weight:
            raise ConfigError(f"search.bounds.{key!r} keeps cluster {name} above 0 but below search.min_weight "
                              f"= {search_cfg.min_weight:g} (a weight is 0 or at least that); allow 0 or at least "
                              f"{search_cfg.min_weight:g}, or lower search.min_weight")
    for kind, total in floors.items():
        if total > 1 + 1e-9:
            raise ConfigError(f"search.bounds: the {kind} minimums (pins count) sum to {total:.3g} > 1: no "
                              f"mixture fits; lower them")


# [proxy] fields the validation model may not change: it reads the search's token store.
FIXED_FOR_VALIDATION = ("tokenizer", "vocab_size", "tokenizer_docs", "lookup", "lookup_weights", "lookup_key")


def validation_model(cfg: RunConfig) -> ProxyConfig:
    """The larger model of the validate stage: [proxy] scaled by validate.width/depth/tokens,
    then validate.model's fields set outright. A proxy time limit scales with the compute."""
    v, proxy_cfg = cfg.validate, cfg.proxy
    scaled = {"n_embd": proxy_cfg.n_embd * v.width, "n_layer": proxy_cfg.n_layer * v.depth,
              "steps": proxy_cfg.steps * v.tokens,
              "timeout_s": proxy_cfg.timeout_s * v.width ** 2 * v.depth * v.tokens}
    bad = sorted(set(v.model) & set(FIXED_FOR_VALIDATION))
    if bad:
        raise ConfigError(f"validate.model may not set {bad}: the validation model reads the search's token "
                          "store, so it keeps the proxy's tokenizer")
    try:
        return from_dict(ProxyConfig, {**to_dict(proxy_cfg), **scaled, **v.model}, "validate.model")
    except ConfigError as e:
        raise ConfigError(str(e).replace("[validate.model]", "validate.model")) from None


def _check_model(proxy_cfg: ProxyConfig, where: str, note: str = "") -> None:
    """A proxy-like model ([proxy] or the validation model): the proxy model and trainer
    check the settings they take (GPTConfig's and TrainConfig's own checks), here named
    as the `where` keys; `note` ends each message."""
    if proxy_cfg.swarm not in ("auto", "stacked", "single"):
        raise ConfigError(f"{where}.swarm must be 'auto', 'stacked' or 'single', got {proxy_cfg.swarm!r}{note}")
    try:
        proxy_cfg.model_config(proxy_cfg.vocab_size)  # the tokenizer's own size is known once it is trained
        proxy_cfg.train_config()
    except ConfigFieldError as e:
        raise ConfigError(f"{where}.{e.field} {e.problem}{note}") from None


def tokens_read(cfg: RunConfig) -> int:
    """The most tokens any model that trains on the token store reads from one cluster: a proxy's
    (the search's proxies, experts, a shared base and its continuations all train with [proxy]'s
    steps, batch_size and seq_len: ProxyConfig.read_cap) or, when validate.enabled, the validation
    model's if more (not an external trainer's: it reads its own data)."""
    figure = cfg.proxy.read_cap()
    if cfg.validate.enabled:
        m = validation_model(cfg)
        if not m.command:
            figure = max(figure, m.read_cap())
    return figure


def token_cap(cfg: RunConfig) -> int:
    """tokenize.cap resolved: the tokens of each cluster the token store keeps (0: all)."""
    return tokens_read(cfg) if cfg.tokenize.cap == "auto" else int(cfg.tokenize.cap)


def _check_tokenize(cfg: RunConfig) -> None:
    cap = cfg.tokenize.cap
    if cap != "auto" and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise ConfigError(f'tokenize.cap must be "auto" (the most tokens a proxy reads from one cluster), 0 (no '
                          f"cap) or a number of tokens, got {cap!r}")
    need = tokens_read(cfg)
    if cap != "auto" and 0 < cap < need:
        raise ConfigError(f"tokenize.cap = {cap} is below the {need} tokens a model reads from one cluster "
                          f"(steps x batch_size x (seq_len + 1) of [proxy], or of the validation model when "
                          f"validate.enabled): its proxies would see a smaller part of each large cluster than "
                          f'an uncapped store gives them; raise it to at least {need}, or use "auto" or 0')


def _check_validate(cfg: RunConfig) -> None:
    v = cfg.validate
    if v.seeds < 3:
        raise ConfigError(f"validate.seeds must be at least 3 (paired seeds give each difference its "
                          f"interval), got {v.seeds}")
    _at_least(cfg, 1, "validate.width", "validate.depth", "validate.tokens", "validate.rank_seeds")
    _at_least(cfg, 0, "validate.task_limit")
    if v.rank_mixtures and v.rank_mixtures < 4:
        raise ConfigError(f"validate.rank_mixtures must be 0 (no rank check) or at least 4 for a rank "
                          f"correlation, got {v.rank_mixtures}")
    unknown = set(v.baselines) - {"uniform", "natural", "one-shot"}
    if unknown:
        raise ConfigError(f"validate.baselines: unknown {sorted(unknown)}; choose from uniform, natural, one-shot")
    if "one-shot" in v.baselines and "one-shot" not in cfg.search.baselines:
        raise ConfigError('validate.baselines has "one-shot", which only a search with "one-shot" in '
                          "search.baselines computes; add it there or drop it here")
    m = validation_model(cfg)
    _check_model(m, "validate.model", " (the validation model: [proxy] with n_embd, n_layer and steps multiplied "
                                      "by validate.width, depth and tokens, then validate.model's settings)")
    if m.command:
        check_command(m.command)
        if v.texts or v.tasks:
            raise ConfigError("validate.texts / validate.tasks are evaluated by the built-in trainer; with an "
                              "external trainer (proxy.command or validate.model.command) leave them empty")
    if v.enabled:
        check_validation_trains(cfg)


def _check_track(cfg: RunConfig) -> None:
    """[track]: a known tracker, and a uri of the kind it takes. Whether the tracker is installed
    or its server answers is not checked: a tracker that fails warns once, the run goes on."""
    t = cfg.track
    if t.backend not in TRACK_BACKENDS:
        raise ConfigError(f"track.backend must be one of {', '.join(map(repr, TRACK_BACKENDS[1:]))} or \"\" (off), "
                          f"got {t.backend!r}")
    if not t.interval_s >= 0:
        raise ConfigError(f"track.interval_s must be >= 0 (0: log only when a stage ends), got {t.interval_s}")
    if t.backend == "wandb" and t.uri and not t.uri.startswith(("http://", "https://")):
        raise ConfigError(f"track.uri {t.uri!r}: with track.backend = \"wandb\" it is a W&B server's URL "
                          "(http(s)://...) or \"\" (W&B's own, or WANDB_MODE=offline); its files go under <run>/wandb")
    if t.backend == "mlflow" and t.uri.startswith("sqlite:") and not t.uri.startswith("sqlite:///"):
        raise ConfigError(f"track.uri {t.uri!r}: an SQLite store is sqlite:///relative/path.db or "
                          "sqlite:////absolute/path.db")


def check_validation_trains(cfg: RunConfig) -> None:
    """Validation trains models: a look-up table standing in for training cannot validate."""
    if cfg.proxy.lookup and "command" not in cfg.validate.model:
        raise ConfigError("validate trains models, but proxy.lookup stands in for training; set "
                          "validate.model.command to a trainer, or do not validate this run")


def check_run_dir(run_dir: str | Path) -> None:
    """The run folder must be local (or mounted): it holds a lock, append-only logs and memory-mapped arrays."""
    from climb.io.files import is_url
    if is_url(str(run_dir)):
        raise ConfigError(f"the run folder {run_dir} is a URL; it must be a local (or mounted) folder. The corpus "
                          "and target may be URLs, and export.destination sends the dataset to an object store")


def _at_least(cfg: RunConfig, low: float, *names: str) -> None:
    for name in names:
        section, key = name.split(".")
        value = getattr(getattr(cfg, section), key)
        if value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}")


COMMAND_FIELDS = ("weights", "out")


def check_command(command: str) -> None:
    """A proxy.command template must name {out} and no placeholder but {weights} and {out}."""
    import string
    try:
        fields_ = [f for _, f, _, _ in string.Formatter().parse(command) if f is not None]
    except ValueError as e:
        raise ConfigError(f"proxy.command {command!r}: {e}; write a literal brace as {{{{ or }}}}") from None
    bad = [f for f in fields_ if f not in COMMAND_FIELDS]
    if bad:
        raise ConfigError(f"proxy.command {command!r}: {{{bad[0]}}} is not a placeholder (only {{weights}} and "
                          "{out} are substituted); write a literal brace as {{ or }}")
    if "out" not in fields_:
        raise ConfigError(f"proxy.command {command!r} has no {{out}}: the command must write its metrics "
                          "record (JSON) to the path substituted for {out}")
