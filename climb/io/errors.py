"""Errors a user can cause and fix: `InputError` names the file and the fix.

The lowest module of climb's I/O (readers and the store layer both raise it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


class InputError(ValueError):
    """Bad input a user can fix; the message names the file and the fix."""


def check_columns(path: Path | str, names: Sequence[str], wanted: Sequence[str]) -> None:
    missing = [c for c in wanted if c not in names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; it has {list(names)}. "
                         "Set corpus.text_column / corpus.id_column (e.g. --set corpus.text_column=content), "
                         "or id_column=\"\" to make ids")
