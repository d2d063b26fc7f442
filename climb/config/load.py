"""Load a run config: TOML file, `--set` overrides, typed build, then the checks.

    from climb.config import load_config
    cfg = load_config("pipelines/demo.toml", ["search.iterations=[8,4]"])
"""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from climb.config.checks import check_config
from climb.config.schema import ConfigError, RunConfig, apply_overrides, from_dict


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} not found; pass an existing file, e.g. pipelines/demo.toml")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML ({e})") from e
    merged = apply_overrides(copy.deepcopy(data), overrides)  # `data` stays the file's own settings
    try:
        cfg = from_dict(RunConfig, merged)
        check_config(cfg)
    except ConfigError as e:
        if path is not None and (not overrides or str(e) == _error_of(data)):
            raise ConfigError(f"{path}: {e}") from e  # the file's own setting, not an override
        raise
    return cfg


def _error_of(data: dict) -> str | None:
    """The ConfigError a config file's own settings give, without the overrides (None: none)."""
    try:
        check_config(from_dict(RunConfig, data))
    except ConfigError as e:
        return str(e)
    return None
