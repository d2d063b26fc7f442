"""climb: find the data mixture to pretrain a language model on.

Stages (each a `run(cfg, paths) -> stats` in its own module): embed, cluster,
search, validate (optional), export, report. Entry points: the `climb` CLI (`climb.cli`), the
Makefile, and `climb.pipeline` for use as a library.
"""
__version__ = "0.1.0"
