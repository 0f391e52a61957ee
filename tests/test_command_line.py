"""A flag on the command line means what the same key means in the recipe: the launch reads one recipe, the YAML
with the flags over it."""

import os

import pytest
import yaml

from hacpo_trl.launch import start, train
from hacpo_trl.launch.recipe import RecipeError
from hacpo_trl.run import placement
from hacpo_trl.run.checkpoints import chosen_checkpoint, resumed_line


def test_share_gpus_on_the_command_line_places_the_process_as_the_config_will(tmp_path, monkeypatch):
    """`--share_gpus true` reaches the placement, which runs before the argument parser: it once read the YAML
    alone, placed the process without sharing, and the config then failed with a RuntimeError traceback."""
    recipe = {"agents": [{"name": "a", "model_name_or_path": "builtin:tiny-llama"},
                         {"name": "b", "model_name_or_path": "builtin:tiny-qwen2"}],
              "output_dir": str(tmp_path / "out"), "use_cpu": True}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    placed = []
    monkeypatch.setattr(placement, "place_process", lambda counts, share=False: placed.append((list(counts), share)))

    def stop(*args, **kwargs):
        raise RecipeError("stopped after the placement")

    monkeypatch.setattr(start, "check_recipe", stop)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert train.main(["--config", str(tmp_path / "r.yaml"), "--share_gpus", "true"]) == 2
    assert placed == [([1, 1], True)]
    placed.clear()
    assert train.main(["--config", str(tmp_path / "r.yaml")]) == 2
    assert placed == [([1, 1], False)]


def test_a_launch_reads_the_recipe_once_and_checks_it_once(tmp_path, monkeypatch, capsys):
    """`hacpo-train` reads the YAML file once: the checks, the placement and the argument parser get the mapping
    read (the parser once read the file again), and the checks before any ML library run once (they ran twice,
    once more inside the recipe check); `--plan` alike."""
    from hacpo_trl.launch import recipe as recipe_module

    written = {"agents": [{"name": "a", "model_name_or_path": "builtin:tiny-llama"}], "use_cpu": True,
               "output_dir": str(tmp_path / "out"), "max_steps": 1, "report_to": "none", "env": {"HACPO_SEEN": "1"}}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(written))
    reads, checks, runs = [], [], []
    load, preflight = yaml.load, recipe_module.preflight
    monkeypatch.setattr(yaml, "load", lambda stream, Loader: (reads.append(hasattr(stream, "read")), load(stream, Loader))[1])  # fmt: skip

    def counted(*args, **kwargs):
        checks.append(args[0]["max_steps"])
        return preflight(*args, **kwargs)

    monkeypatch.setattr(recipe_module, "preflight", counted)
    monkeypatch.setattr(start, "preflight", counted)
    monkeypatch.setattr(train, "run", lambda script_args, config, rewards: runs.append(config) or 0)
    monkeypatch.delenv("HACPO_SEEN", raising=False)
    assert train.main(["--config", str(tmp_path / "r.yaml"), "--max_steps", "2"]) == 0
    assert (reads.count(True), checks, runs[0].max_steps, runs[0].use_cpu) == (1, [2], 2, True)
    assert os.environ.pop("HACPO_SEEN") == "1"  # the recipe's `env`, set as TrlParser sets it
    reads.clear(), checks.clear()
    assert train.main(["--config", str(tmp_path / "r.yaml"), "--plan", "--max_steps", "3"]) in (0, 1)
    assert (reads.count(True), checks) == (1, [3])
    # the key check reuses the agents the checks resolved, and still refuses an override that is no field
    written["agents"][0]["overrides"] = {"temprature": 0.5}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(written))
    assert train.main(["--config", str(tmp_path / "r.yaml")]) == 2
    assert "recipe key 'agents': agent 'a': cannot override 'temprature'" in capsys.readouterr().err


@pytest.mark.parametrize(("requested", "expected"), [("true", "a/2"), ("True", "a/2"), ("false", None), (True, "a/2")])
def test_resume_from_checkpoint_true_on_the_command_line_is_the_newest_complete_step(requested, expected):
    """The argument parser gives `--resume_from_checkpoint true` as the string "true" (a recipe's `true` is a bool):
    both resume from the newest step every agent saved, not from a folder named "true"."""
    complete, everyone = {2: "a/2", 4: "a/4"}, [("A", True, [2, 4], True), ("B", True, [2], True)]
    assert chosen_checkpoint(requested, "A", complete, everyone, str) == expected
    assert chosen_checkpoint("a/4", "A", complete, everyone, str) == "a/4"
    # the run says where it continues from
    assert resumed_line("A", "out/A/checkpoint-2", 2) == "hacpo: agent 'A' resumes from out/A/checkpoint-2 (step 2)"
    assert resumed_line("A", None, 0) is None


def test_the_probe_reads_the_recipe_with_its_flags_as_training_does():
    """`hacpo-probe --sharing recommended --share_gpus true`: the recipe checks and the placement see the flags (its
    own `--prompts` and `--output` left out), as `hacpo-train` does."""
    from pathlib import Path

    from hacpo_trl.launch.probe import _probe_flags
    from hacpo_trl.launch.start import recipe_with_flags

    path = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny_size.yaml")
    argv = ["--config", path, "--sharing", "recommended", "--prompts", "16", "--output=p.json", "--share_gpus", "true"]
    _, recipe = recipe_with_flags(path, argv, own=_probe_flags())
    assert (recipe["sharing"], recipe["peer_prompts"], recipe["share_gpus"]) == ("recommended", "failed", True)
    assert "prompts" not in recipe and "output" not in recipe and recipe["max_steps"] == 60
