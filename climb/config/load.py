"""Load a run config: TOML file, `--set` overrides, typed build, then the checks.

    from climb.config import load_config
    cfg = load_config("pipelines/demo.toml", ["search.iterations=[8,4]"])
    cfg = load_config(None, ['target.objective={bpb=1.0, "piqa/acc"={weight=0.5, goal="maximize"}}'])

`target.objective` may be written as a table of metric name -> weight or {weight, goal};
`objective_table` turns it into the names (in order) and `target.weights` / `target.goals`.
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
        cfg = from_dict(RunConfig, objective_table(merged))
        check_config(cfg)
    except ConfigError as e:
        if path is not None and (not overrides or str(e) == _error_of(data)):
            raise ConfigError(f"{path}: {e}") from e  # the file's own setting, not an override
        raise
    return cfg


def _error_of(data: dict) -> str | None:
    """The ConfigError a config file's own settings give, without the overrides (None: none)."""
    try:
        check_config(from_dict(RunConfig, objective_table(copy.deepcopy(data))))
    except ConfigError as e:
        return str(e)
    return None


def objective_table(data: dict) -> dict:
    """`data` (a config as plain data, changed in place) with a table `target.objective` spelled
    out: its names as the list `objective`, their weights in `weights` and goals in `goals`
    (beside any set there directly; a metric given in both is refused). Whole-number weights
    become floats, so `1` and `1.0` key alike. A weight or goal of the wrong kind is left for
    the checks (climb.config.checks) to name."""
    target = data.get("target")
    if not isinstance(target, dict):
        return data
    table = target.get("objective")
    if isinstance(table, dict):
        weights, goals = {}, {}
        for name, spec in table.items():
            if not isinstance(spec, dict):
                spec = {"weight": spec}
            unknown = sorted(set(spec) - {"weight", "goal"})
            if unknown:
                raise ConfigError(f"target.objective.{name}: unknown key(s) {unknown}; a metric takes a weight "
                                  'and/or a goal, e.g. {weight = 0.5, goal = "maximize"}')
            weights.update({name: spec["weight"]} if "weight" in spec else {})
            goals.update({name: spec["goal"]} if "goal" in spec else {})
        for field, got in (("weights", weights), ("goals", goals)):
            given = target.get(field, {})
            if not isinstance(given, dict):
                continue  # from_dict names the wrong type
            both = sorted(set(given) & set(got))
            if both:
                raise ConfigError(f"target.{field} and the table target.objective both set {both}; set each once")
            target[field] = {**given, **got}
        target["objective"] = list(table)
    if isinstance(target.get("weights"), dict):
        target["weights"] = {m: float(w) if type(w) is int else w for m, w in target["weights"].items()}
    return data
