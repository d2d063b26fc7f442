"""docs/configuration.md names every field of every config section, in that section's row."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from climb.config.schema import RunConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def undocumented(doc: str) -> dict[str, list[str]]:
    """{section: fields its row of the table does not name in backticks}."""
    cfg, out = RunConfig(), {}
    for f in dataclasses.fields(RunConfig):
        sec = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(sec):
            continue
        rows = [ln for ln in doc.splitlines() if ln.startswith(f"| `[{f.name}]`")]
        row = rows[0] if rows else ""
        missing = [g.name for g in dataclasses.fields(sec) if f"`{g.name}`" not in row]
        if missing:
            out[f.name] = missing
    return out


def test_every_config_field_is_documented():
    assert undocumented(DOC.read_text()) == {}


def test_a_missing_field_is_found():
    doc = DOC.read_text().replace("`final_kl`", "final_kl")
    assert undocumented(doc) == {"search": ["final_kl"]}
    with pytest.raises(AssertionError):
        assert undocumented(doc) == {}
