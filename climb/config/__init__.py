"""Run configuration: the dataclasses (`schema`), the rules a loaded config meets
(`checks`) and loading from TOML with `--set` overrides (`load`). Importing it is
cheap (no numeric stack), so the CLI can refuse a bad config at once.

    from climb.config import load_config, RunConfig
"""
from climb.config.load import load_config  # noqa: F401
from climb.config.schema import (EMBED_BACKENDS, EMBED_STORE_DTYPES, OPTIONAL, SEARCH_ACQUISITIONS,  # noqa: F401
                                 SEARCH_FINALS, SEARCH_PREDICTORS, STAGES, TRACK_BACKENDS, ClusterConfig, ConfigError,
                                 CorpusConfig, DedupConfig,
                                 EmbedConfig, ExecutorConfig, ExportConfig, ProxyConfig, RunConfig, SearchConfig,
                                 TargetConfig, TokenizeConfig, TrackConfig, ValidateConfig, apply_overrides, digest,
                                 from_dict, to_dict, to_toml, without)
