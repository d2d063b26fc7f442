"""The run folder's layout: where each stage's outputs live.

A run lives in one folder: `<run>/{config.toml, data/, embed/, cluster/, tokenize/,
search/, validate/, export/, report/}`. `RunPaths` names every file in it, and a stage
reaches another's outputs only through it: `paths.cluster.summary`, `paths.search.results`,
`paths.export.card`. The rule that decides whether a stage runs, resumes or is skipped
(manifests, keys, damaged outputs) is climb/runtime/stage.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from climb.config import RunConfig, to_toml
from climb.io.files import atomic_path, read_json, resolve_corpus_files, shard_name

_DIGEST_CACHES: dict = {}


@dataclass(frozen=True)
class EmbedOutputs:
    """`<run>/embed/`: one embedding shard per corpus shard."""
    dir: Path

    def vectors(self, shard: str) -> Path:
        """[docs, dim], L2-normalised, in corpus order (empty documents skipped); float32 or
        float16 (`embed.store_dtype`): readers cast to float32."""
        return self.dir / f"{shard}.npy"

    def ids(self, shard: str) -> Path:
        """Parquet (id, bytes) aligned with `vectors(shard)`; written last, so it marks the shard done."""
        return self.dir / f"{shard}.ids.parquet"


@dataclass(frozen=True)
class ClusterOutputs:
    """`<run>/cluster/`: centroids, the cluster summary and per-shard assignments."""
    dir: Path

    @property
    def centroids(self) -> Path:  # the k fine k-means centroids
        return self.dir / "centroids.npy"

    @property
    def cluster_centroids(self) -> Path:  # one per (merged) cluster
        return self.dir / "cluster_centroids.npy"

    @property
    def summary(self) -> Path:  # clusters.json: n_clusters, sizes, top terms, exemplars, fine_to_cluster
        return self.dir / "clusters.json"

    @property
    def fitted(self) -> Path:  # what the centroids were fitted on, and the fine -> cluster plan kept with them
        return self.dir / "fitted.json"

    def fine(self, shard: str) -> Path:
        return self.dir / "fine" / f"{shard}.parquet"

    def shard_summary(self, shard: str) -> Path:  # one shard's part of clusters.json, kept while its inputs stay
        return self.dir / "summary_parts" / f"{shard}.json"

    def text_hashes(self, shard: str) -> Path:  # each document's normalised-text hash (climb.stages.cluster.dedup)
        return self.dir / "summary_parts" / f"{shard}.hashes.npy"

    def assignments(self, shard: str) -> Path:
        """Parquet: one row per embedded document, `cluster` (-1: pruned) and its distance."""
        return self.dir / "assign" / f"{shard}.parquet"


@dataclass(frozen=True)
class TokenizeOutputs:
    """`<run>/tokenize/`: the proxies' tokenizer and the per-cluster token store."""
    dir: Path

    @property
    def tokenizer(self) -> Path:
        return self.dir / "tokenizer.json"

    @property
    def store(self) -> Path:  # a proxies.tokens.TokenStore folder
        return self.dir / "tokens"


@dataclass(frozen=True)
class SearchOutputs:
    """`<run>/search/`: every proxy result, the plans, the found mixture and its comparison."""
    dir: Path

    @property
    def results(self) -> Path:  # append-only JSON lines, one record per proxy run
        return self.dir / "results.jsonl"

    def plan(self, iteration: int) -> Path:
        return self.dir / f"plan_{iteration}.json"

    @property
    def plans(self) -> list[Path]:
        return sorted(self.dir.glob("plan_*.json"))

    @property
    def mixture(self) -> Path:  # the found mixture, with the natural and uniform ones
        return self.dir / "mixture.json"

    @property
    def sources(self) -> Path:  # each source's tokens and share in each cluster (climb.stages.search.sources)
        return self.dir / "sources.json"

    @property
    def replicates(self) -> Path:
        return self.dir / "replicates.json"

    @property
    def finalists(self) -> Path:  # the last iteration's finalists, their seeds and records (search.finalists)
        return self.dir / "finalists.json"

    @property
    def one_shot(self) -> Path:
        return self.dir / "one_shot.json"

    @property
    def one_shot_mixture(self) -> Path:
        return self.dir / "one_shot_mixture.json"

    @property
    def experts(self) -> Path:  # {mixture id: record} of the expert proxies (search.experts)
        return self.dir / "experts.json"

    def expert_logprobs(self, cluster: int) -> Path:  # an expert's per-token log-probabilities
        return self.dir / "experts" / f"cluster_{cluster:03d}.npy"

    @property
    def base(self) -> Path:  # {"base": record, "key": ...} of the shared base (search.base)
        return self.dir / "base.json"

    @property
    def base_checkpoint(self) -> Path:  # the shared base's paused state
        return self.dir / "base" / "base.pt"

    @property
    def merge(self) -> Path:  # {mixture id: record} of the base's continuations per cluster (search.merge)
        return self.dir / "merge.json"

    def merge_model(self, cluster: int) -> Path:  # one cluster's continuation of the base (a state dict)
        return self.dir / "merge" / f"cluster_{cluster:03d}.pt"

    def rungs(self, iteration: int) -> Path:  # {mixture id: record} at the rung (search.halving)
        return self.dir / f"rungs_{iteration}.json"

    def checkpoint(self, mixture_id: str) -> Path:  # a proxy paused at the rung
        return self.dir / "checkpoints" / f"{mixture_id}.pt"

    @property
    def comparison(self) -> Path:
        return self.dir / "comparison.json"

    def repick(self, spec: str) -> Path:  # `climb repick` under the objective whose digest is `spec`
        return self.dir / "repicks" / f"{spec}.json"

    def repick_comparison(self, spec: str) -> Path:  # that re-pick's comparison proxies (`--compare`)
        return self.dir / "repicks" / f"{spec}.comparison.json"

    @property
    def repicks(self) -> list[Path]:  # every re-pick kept, in name order
        return sorted(p for p in (self.dir / "repicks").glob("*.json") if not p.name.endswith(".comparison.json"))

    @property
    def affinity(self) -> Path:  # which clusters read like the target (search.target_prior)
        return self.dir / "affinity.json"

    @property
    def contamination(self) -> Path:  # the target's n-grams found in the token store (search.contamination)
        return self.dir / "contamination.json"

    @property
    def quality(self) -> Path:
        return self.dir / "quality.json"

    @property
    def reuse_plan(self) -> Path:  # search.reuse: the confirmation round, or across other clusters the component
        return self.dir / "reuse_plan.json"

    @property
    def reuse(self) -> Path:  # what the confirmation round found (or the component), and what the search did
        return self.dir / "reuse.json"

    @property
    def swarm_weights(self) -> Path:
        return self.dir / "swarm_weights.csv"

    @property
    def swarm_metrics(self) -> Path:
        return self.dir / "swarm_metrics.csv"


@dataclass(frozen=True)
class ValidateOutputs:
    """`<run>/validate/`: the larger models' plan, results and summary."""
    dir: Path

    @property
    def plan(self) -> Path:
        return self.dir / "plan.json"

    @property
    def results(self) -> Path:
        return self.dir / "results.jsonl"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"


@dataclass(frozen=True)
class ExportOutputs:
    """`<run>/export/`: the dataset (unless sent to export.destination), its plan and blend files."""
    dir: Path

    def plan(self, shard: str) -> tuple[Path, Path, Path]:
        """Per corpus row of the shard: copies to export, cluster, tokens kept by a cut (0: whole)."""
        d = self.dir / "plan"
        return d / f"{shard}.npy", d / f"{shard}.clusters.npy", d / f"{shard}.cut.npy"

    @property
    def mixture(self) -> Path:
        return self.dir / "mixture.json"

    @property
    def megatron_blend(self) -> Path:
        return self.dir / "megatron_blend.txt"

    @property
    def interleave(self) -> Path:
        return self.dir / "interleave.json"

    @property
    def destination(self) -> Path:  # what was written to export.destination (size and tag per object)
        return self.dir / "destination.json"


@dataclass(frozen=True)
class ReportOutputs:
    dir: Path

    @property
    def page(self) -> Path:
        return self.dir / "report.md"

    @property
    def html(self) -> Path:  # report.md as one self-contained page, figures inlined
        return self.dir / "index.html"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"


@dataclass(frozen=True)
class RunPaths:
    """Every path of a run folder: each stage's outputs are reached through these, never by name."""
    root: Path

    def stage(self, name: str) -> Path:
        p = self.root / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    def manifest(self, name: str) -> Path:
        return self.root / name / "manifest.json"

    @property
    def digests(self):
        """The run's cache of input content digests (climb.io.digests), one per run folder and process."""
        from climb.io.digests import DigestCache
        key = str(self.root)
        if key not in _DIGEST_CACHES:
            _DIGEST_CACHES[key] = DigestCache(self.root / ".climb" / "digests.json")
        return _DIGEST_CACHES[key]

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def data(self) -> Path:  # inputs built by climb itself (the demo corpus)
        return self.root / "data"

    @property
    def track(self) -> Path:  # what [track] logged, under which tracking run (climb.runtime.track)
        return self.root / "track.json"

    @property
    def embed(self) -> EmbedOutputs:
        return EmbedOutputs(self.root / "embed")

    @property
    def cluster(self) -> ClusterOutputs:
        return ClusterOutputs(self.root / "cluster")

    @property
    def tokenize(self) -> TokenizeOutputs:
        return TokenizeOutputs(self.root / "tokenize")

    @property
    def search(self) -> SearchOutputs:
        return SearchOutputs(self.root / "search")

    @property
    def validate(self) -> ValidateOutputs:
        return ValidateOutputs(self.root / "validate")

    @property
    def export(self) -> ExportOutputs:
        return ExportOutputs(self.root / "export")

    @property
    def report(self) -> ReportOutputs:
        return ReportOutputs(self.root / "report")

    def stats(self, stage: str) -> dict:
        """The `stats` a finished stage recorded in its manifest."""
        return read_json(self.manifest(stage))["stats"]

    def shards(self) -> list[str]:
        """The corpus shards, in order, as the embed stage recorded them (every later stage's unit)."""
        return self.stats("embed")["shards"]

    def n_clusters(self) -> int:
        return read_json(self.cluster.summary)["n_clusters"]

    def corpus_files(self, cfg: RunConfig) -> list[Path]:
        return resolve_corpus_files(cfg.corpus.paths, self.root, cfg.corpus.max_shards)

    def shard_files(self, cfg: RunConfig) -> dict[str, Path | str]:
        """Corpus file of each shard name."""
        return {shard_name(f): f for f in self.corpus_files(cfg)}

    def save_config(self, cfg: RunConfig) -> None:
        """Write config.toml, only if it changed: a finished run in a read-only folder still reads."""
        self.root.mkdir(parents=True, exist_ok=True)
        path, text = self.config, to_toml(cfg)
        if path.exists() and path.read_text() == text:
            return
        with atomic_path(path) as tmp:
            tmp.write_text(text)
