# climb: `make demo` runs every stage on the embedded demo; `make test` runs the tests.
# Each stage target runs the stages it depends on first (finished ones are skipped).
#   make cluster CONFIG=pipelines/bench.toml RUN=runs/bench
CONFIG ?= pipelines/demo.toml
RUN ?= runs/$(basename $(notdir $(CONFIG)))
SET ?=
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS = --config $(CONFIG) --run $(RUN) $(foreach s,$(SET),--set $(s))
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HOME ?= $(CURDIR)/.cache/huggingface

# `make validate`: the larger model on the found mixture, the baselines and search mixtures
# (the validate stage; the report gains its "Does it transfer?" section).
.PHONY: install install-gpu demo run validate embed cluster tokenize search export report test bench bench-procs bench-e2e bench-scale bench-steering bench-updates bench-long clean

install: $(STAMP)

# CPU torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml requirements-torch.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-torch.txt
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# A GPU node: PyPI's default (CUDA) torch, the `gpu` extra, and FAISS's GPU build in place of faiss-cpu.
install-gpu:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch
	$(BIN)/python -m pip install --quiet -e '.[gpu]'
	$(BIN)/python -m pip uninstall --quiet -y faiss-cpu
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps 'faiss-gpu-cu12>=1.9'
	$(BIN)/python -c "import faiss, torch; print('FAISS GPUs:', faiss.get_num_gpus(), '| torch CUDA:', torch.cuda.is_available())"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/climb run $(ARGS)

run: demo

validate: $(STAMP)
	$(BIN)/climb run $(ARGS) --set validate.enabled=true

embed cluster tokenize search export report: $(STAMP)
	$(BIN)/climb $@ $(ARGS)

# One process per core, up to four (each test file stays in one process, so its module fixtures
# are built once); `$(BIN)/python -m pytest` alone runs them in one.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/run.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/profiles.py
	$(MAKE) bench-procs

# Proxies in worker processes, and the search beside a busy process, on a demo run.
bench-procs: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/climb run --config pipelines/demo.toml --run runs/bench-demo
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/swarm_processes.py --run runs/bench-demo
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/busy_machine.py --run runs/bench-demo

# Whole runs timed per stage (the demo: 5 minutes; the bench preset on all 8 shards: 40).
bench-e2e: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/end_to_end.py --fresh --name demo --config pipelines/demo.toml --run runs/e2e-demo
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/end_to_end.py --fresh --name bench_2_shards --config pipelines/bench.toml \
		--run runs/e2e-bench2 --set corpus.max_shards=2
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/end_to_end.py --fresh --name bench_8_shards --config pipelines/bench.toml \
		--run runs/e2e-bench8 --set corpus.max_shards=8 --set 'corpus.id_column=""'

# Steering measured: the demo with its code source pinned at 10 % against the same search
# unpinned (about 20 minutes a seed on 2 cores), and the bench's tasks re-picked one by one
# from one finished search (about an hour).
bench-steering: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/steering.py pin --seeds 0 1 --json benchmarks/results/steering_pin.json
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/steering.py tasks --json benchmarks/results/steering_tasks.json
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/steering.py more-seeds --json benchmarks/results/steering_tasks.json

# Corpus updates measured: five versions of the demo corpus, a search reused from the earlier
# run against a full search on each update, five search seeds, with the component kept as found
# and sharpened (several hours on 2 cores; run folders runs/g52/ resume where they stopped).
bench-updates: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/corpus_updates.py train --seeds 0 1 2 3 4
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/corpus_updates.py train --arm reused-sharp-alone --seeds 0 1 2 3 4
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/corpus_updates.py train --arm reused-after-sharp --seeds 0 1 2 3 4
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/corpus_updates.py judge --sequence sharp --seeds 0 1 2 3 4 --json benchmarks/results/corpus_updates_sequence_sharp.json
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/corpus_updates.py judge --seeds 0 1 2 3 4 --json benchmarks/results/corpus_updates.json

# The bench preset's long measurements (the steady answer's sixteen searches, then the corpus
# updates' chains: days of one core) as a queue that goes on where it stopped when started again;
# `python benchmarks/plan_queue.py status benchmarks/plans/bench_long.plan` says what is where.
bench-long: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/plan_queue.py run benchmarks/plans/bench_long.plan --lanes 2

# The whole pipeline at 100k, 300k and 1M documents (benchmarks/scale.py; about 25 minutes on
# 2 cores): builds runs/scale-corpus from ../shared/data first, then results/scale.json.
bench-scale: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/embed_static.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/scale.py --set 'embed.backend="static"'
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/scale.py --sizes 1000000 10000000 --set 'embed.backend="tuned"' \
		--set 'embed.student="tfidf"' --out benchmarks/results/scale_10m.json
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/scale_kill.py --docs 10000000

clean:
	rm -rf runs .cache
