"""The pipeline's stages, one module each, in the order they run:

demo (builds the embedded demo corpus) → embed → cluster → tokenize
(`tokenization`) → search → validate (optional) → export → report.

Each stage module has `run(cfg, paths) -> stats` and `key(cfg, paths)`; it reads
the typed outputs of the stages before it through `climb.runtime.stage.RunPaths`
and never imports an execution backend. `embed_backend` (OpenVINO / torch) and
`kmeans` (FAISS / torch) are the embed and cluster stages' compute kernels.
"""
