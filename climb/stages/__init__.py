"""The pipeline's stages, one package each, in the order they run:

embed → cluster → tokenize → search → validate (optional) → export → report.

Each package's face (`__init__.py`) holds the stage itself, `run(cfg, paths) -> stats` and
`key(cfg, paths)`, and says what the stage reads and writes; the modules beside it are the
stage's own parts. A stage reads the outputs of the stages before it through
`climb.runtime.layout.RunPaths` and never imports an execution backend.
"""
