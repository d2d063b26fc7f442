"""Paths in a task YAML are read from the YAML's folder: a task YAML over a local JSONL file
loads from any current folder (climb.runtime.harness.local_paths), the shipped
pipelines/tasks/*.yaml included; paths found only from the current folder, absolute paths
and URLs stay as they are."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from climb.config import TargetConfig
from climb.runtime import harness

REPO = Path(__file__).resolve().parents[1]
ITEMS = [{"query": "Question: What keeps bread fresh?\nAnswer:", "choices": [" A cloth bag.", " Water."], "gold": 0},
         {"query": "Question: How to dry shoes?\nAnswer:", "choices": [" An oven.", " Newspaper."], "gold": 1},
         {"query": "Question: Where do plants grow?\nAnswer:", "choices": [" In the sun.", " In a drawer."], "gold": 0}]


def _task(folder: Path, data_files: str, name: str = "mine_local") -> Path:
    """A multiple-choice task YAML in `folder`, naming its data as `data_files`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "items.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ITEMS))
    path = folder / f"{name}.yaml"
    path.write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_files}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
""")
    return path


def _docs(tasks: dict) -> int:
    return sum(len(list(task.test_docs())) for _, task in harness._leaves(tasks))


def test_a_task_yaml_loads_its_data_from_another_folder(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    yaml = _task(tmp_path / "config" / "tasks", "data/items.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # data/items.jsonl is not here: only the YAML's folder has it
    harness._CACHE.clear()
    target = TargetConfig(lm_eval=(str(yaml),))
    harness.check(target)
    assert _docs(harness.load_tasks(target)) == len(ITEMS)
    # The YAML named by a path relative to the current folder loads the same.
    monkeypatch.chdir(tmp_path)
    harness._CACHE.clear()
    assert _docs(harness.load_tasks(TargetConfig(lm_eval=("config/tasks/mine_local.yaml",)))) == len(ITEMS)


def test_a_missing_data_file_is_named_from_the_yaml_folder(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from climb.io.files import InputError
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    yaml = _task(tmp_path / "tasks", "data/nothing.jsonl", name="missing_local")
    monkeypatch.chdir(tmp_path)
    harness._CACHE.clear()
    with pytest.raises(InputError, match="cannot load") as e:
        harness.check(TargetConfig(lm_eval=(str(yaml),)))
    assert str(tmp_path / "tasks" / "data" / "nothing.jsonl") in str(e.value)
    assert "\n" not in str(e.value)


def test_the_relative_task_file_is_named_with_the_current_folder(tmp_path, monkeypatch):
    from climb.io.files import InputError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"task file pipelines/tasks/piqa_local.yaml not found \(a relative path "
                                         r"is read from the current folder, "):
        harness.task_specs(TargetConfig(lm_eval=("pipelines/tasks/piqa_local.yaml",)))


@pytest.mark.parametrize("yaml", sorted((REPO / "pipelines" / "tasks").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_task_yamls_load_from_any_folder(yaml, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import yaml as pyyaml
    config = pyyaml.safe_load(yaml.read_text())
    data = (yaml.parent / config["dataset_kwargs"]["data_files"]["test"]).resolve()
    if not data.is_file():
        pytest.skip(f"{data} is not here (the shared data)")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.chdir(tmp_path)
    harness._CACHE.clear()
    got = harness.local_paths(config, yaml.parent)["dataset_kwargs"]["data_files"]["test"]
    assert Path(got).resolve() == data
    if yaml.stem == "piqa_local":  # one is loaded through the harness (the others differ only in their file)
        harness.check(TargetConfig(lm_eval=(str(yaml),)))


def test_local_paths(tmp_path, monkeypatch):
    folder = tmp_path / "tasks"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "a.jsonl").write_text("{}\n")
    (tmp_path / "only_here.jsonl").write_text("{}\n")
    (folder / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = {"dataset_path": "json", "dataset_kwargs": {"data_files": {
        "test": "data/a.jsonl", "train": ["data/*.jsonl", "only_here.jsonl"], "validation": "s3://b/v.jsonl",
        "other": str(tmp_path / "abs.jsonl"), "gone": "data/gone.jsonl"}}}
    got = harness.local_paths(cfg, folder)
    files = got["dataset_kwargs"]["data_files"]
    assert files["test"] == str(folder / "data" / "a.jsonl")
    assert files["train"] == [str(folder / "data" / "*.jsonl"), "only_here.jsonl"]  # found only from here: kept
    assert files["validation"] == "s3://b/v.jsonl" and files["other"] == str(tmp_path / "abs.jsonl")
    assert files["gone"] == str(folder / "data" / "gone.jsonl")  # found nowhere: named from the YAML's folder
    assert got["dataset_path"] == "json"  # a builder, not a folder
    assert cfg["dataset_kwargs"]["data_files"]["test"] == "data/a.jsonl"  # the config given is left as it was
    # data_dir: data_files are read from it, so only it moves; a local dataset_path folder moves too.
    got = harness.local_paths({"dataset_path": "./mine", "dataset_kwargs": {"data_dir": "data",
                                                                           "data_files": "a.jsonl"}}, folder)
    assert got["dataset_kwargs"] == {"data_dir": str(folder / "data"), "data_files": "a.jsonl"}
    assert got["dataset_path"] == str(folder / "mine")
