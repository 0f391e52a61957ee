"""Bad inputs of a first launch (docs/reviews/newcomer-t3.md): each is refused before any ML library is imported,
with exactly one `hacpo-train: error:` line naming the problem, however the two ranks of a launch race."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacpo_trl.recipe import RecipeError, load_recipe, numbers_as_values, preflight
from helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "agents": [
        {"name": "tiny-llama", "model_name_or_path": "builtin:tiny-llama"},
        {"name": "tiny-qwen2", "model_name_or_path": "builtin:tiny-qwen2"},
    ],
    "reward_funcs": ["arithmetic_exact"],
    "max_steps": 2,
    "use_cpu": True,
}


def _agent(model: str) -> dict:
    return {"agents": [GOOD["agents"][0], {"name": "tiny-qwen2", "model_name_or_path": model}]}


# (id, recipe change, extra command-line flags, launch size, expected text of the one error line)
CASES = [
    ("typo_key", {"learnin_rate": 1e-6}, [], 2, "unknown recipe key 'learnin_rate'; did you mean 'learning_rate'?"),
    ("missing_folder", _agent("{tmp}/no-such-model"), [], 2, "model folder '{tmp}/no-such-model' does not exist"),
    ("bad_task", {"task": "arithmetics"}, [], 2, "recipe key 'task' must be"),
    (
        "hub_dataset_offline",
        {"task": "dataset", "dataset_name": "someorg/no-such-dataset"},
        [],
        2,
        "the Hub is offline",
    ),
    ("missing_jsonl", {"task": "dataset", "dataset_name": "{tmp}/no.jsonl"}, [], 2, "'{tmp}/no.jsonl' does not exist"),
    ("bad_reward", {"reward_funcs": ["no_such_module:no_such_reward"]}, [], 2, "no_such_module"),
    ("three_processes", {}, [], 3, "num_processes add up to 2 (tiny-llama: 1, tiny-qwen2: 1) but the launch has 3"),
    ("negative_lr", {"learning_rate": -1.0e-4}, [], 2, "recipe key 'learning_rate' must be >= 0"),
    ("negative_lr_flag", {}, ["--learning_rate", "-1e-4"], 2, "recipe key 'learning_rate' must be >= 0"),
    ("one_generation", {"num_generations": 1}, [], 2, "'num_generations' must be at least 2"),
    ("slash_name", {"agents": [{"name": "org/tiny-qwen2", "model_name_or_path": "x"}]}, [], 2, "without '/'"),
    ("empty_recipe", None, [], 2, "must be a YAML mapping of settings"),
    ("malformed_yaml", "agents: [a\n  b: c\n", [], 2, "bad.yaml:2:4: malformed YAML"),
    ("zero_length", {"max_completion_length": 0}, [], 2, "'max_completion_length' must be a positive number"),
    ("output_file", {"output_dir": "{tmp}/a-file"}, [], 2, "'{tmp}/a-file' is a file, not a folder"),
]
RACY = {"bad_reward", "three_processes"}  # the two the review saw lose their message (3 of 4 launches)


def _write(tmp: Path, change) -> Path:
    path = tmp / "bad.yaml"
    (tmp / "a-file").write_text("not a folder\n")
    if isinstance(change, str):
        path.write_text(change)
    elif change is None:
        path.write_text("# nothing\n")
    else:
        text = yaml.safe_dump({**GOOD, "output_dir": str(tmp / "out"), **change})
        path.write_text(text.replace("{tmp}", str(tmp)))
    return path


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "typo_key"], ids=lambda c: c[0])
def test_each_bad_input_is_refused_by_the_light_checks(case, tmp_path, monkeypatch):
    """The pure function every rank runs before importing trl (the typo check needs TRL's field list: not here)."""
    name, change, flags, size, expected = case
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _write(tmp_path, change)
    with pytest.raises(RecipeError) as info:
        preflight(load_recipe(str(path), numbers_as_values(flags)), num_processes=size)
    assert expected.replace("{tmp}", str(tmp_path)) in str(info.value)


def test_the_good_recipe_passes_and_a_negative_flag_becomes_a_value():
    preflight(GOOD, num_processes=2)
    assert numbers_as_values(["--learning_rate", "-1e-4", "--seed", "3", "--x", "-.5"]) == [
        "--learning_rate=-1e-4",
        "--seed",
        "3",
        "--x=-.5",
    ]


def _launch(tmp: Path, change, flags, size) -> subprocess.Popen:
    path = _write(tmp, change)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"),
        "--num_processes", str(size), "--main_process_port", str(free_port()),
        "-m", "hacpo_trl.train", "--config", str(path), *flags,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HACPO_ERROR_WAIT": "120"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.launch
def test_every_bad_input_gives_one_line_in_a_real_two_process_launch(tmp_path):
    """Every case of the table launched for real (the racy ones three times), four launches at a time: each exits
    with the launcher's status 1 (a child exited 2) and prints exactly one `hacpo-train: error:` line naming the
    problem. The other ranks wait for the launcher's stop instead of exiting first (see `hacpo_trl.train.refuse`)."""
    runs = [(c, i) for c in CASES for i in range(3 if c[0] in RACY else 1)]
    failures, pending = [], list(runs)
    while pending:
        batch, pending = pending[:4], pending[4:]
        started = []
        for (name, change, flags, size, expected), i in batch:
            tmp = tmp_path / f"{name}-{i}"
            tmp.mkdir()
            started.append((name, expected.replace("{tmp}", str(tmp)), _launch(tmp, change, flags, size)))
        for name, expected, proc in started:
            _, err = proc.communicate(timeout=600)
            lines = [line for line in err.splitlines() if "hacpo-train: error:" in line]
            if (
                proc.returncode != 1
                or len(lines) != 1
                or expected not in lines[0]
                or "Traceback" in err.split("hacpo-train: error:")[0]
            ):
                failures.append((name, proc.returncode, lines, err[-1500:]))
    assert not failures, failures


def test_an_output_folder_holding_a_run_is_refused_unless_overwrite_or_resume(tmp_path):
    from hacpo_trl.recipe import check_output_dir

    recipe = {**GOOD, "output_dir": str(tmp_path / "run")}
    check_output_dir(recipe)  # nothing there yet
    (tmp_path / "run" / "tiny-qwen2").mkdir(parents=True)
    check_output_dir(recipe)  # an empty agent folder (a launch that failed at start-up) holds no run
    (tmp_path / "run" / "tiny-qwen2" / "config.json").write_text("{}")
    with pytest.raises(
        RecipeError, match=r"run/tiny-qwen2' already holds a run \(config.json\).*--overwrite_output_dir"
    ):
        check_output_dir(recipe)
    check_output_dir({**recipe, "overwrite_output_dir": True})
    check_output_dir({**recipe, "resume_from_checkpoint": True})
    (tmp_path / "run" / "hacpo_summary.json").write_text("{}")
    with pytest.raises(RecipeError, match=r"'.*run' already holds a run \(hacpo_summary.json\)"):
        check_output_dir(recipe)


@pytest.mark.launch
def test_a_second_launch_into_a_finished_run_stops_with_one_line(tmp_path):
    """Single process (exit 2, the status the README states for it): refused before any ML library loads."""
    out = tmp_path / "out"
    (out / "tiny-llama").mkdir(parents=True)
    (out / "hacpo_summary.json").write_text("{}")
    path = _write(tmp_path, {"output_dir": str(out)})
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.train", "--config", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hacpo-train: error: output folder '{out}' already holds a run (hacpo_summary.json); choose a new "
        "--output_dir, or pass --overwrite_output_dir to train into it anyway, or set `resume_from_checkpoint: true` "
        "in the recipe to continue it"
    ]


def test_help_leads_with_the_recipe_workflow_without_importing_trl():
    code = (
        "import sys; from hacpo_trl.train import main; main(['--help']); print('trl imported:', 'trl' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    out = proc.stdout
    assert out.startswith("usage: hacpo-train --config RECIPE")
    for needed in ("--config", "--plan", "--accelerate_config", "--gpu_memory_gib", "--help-all", "arithmetic_trace"):
        assert needed in out, needed
    for reward in ("arithmetic_exact", "math_verify", "boxed_format", "module:function"):
        assert reward in out, reward
    assert "--peer_delta" in out and "--alpha" in out  # HACPO's own settings, read from HACPOConfig's source
    assert len(out.splitlines()) < 120 and out.strip().endswith("trl imported: False")


def test_curves_after_one_generation_batch_show_markers_and_held_out_accuracy(tmp_path, monkeypatch):
    import matplotlib.figure

    from hacpo_trl.train import _plot

    figures = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (figures.append(fig), save(fig, *a, **k))
    )
    one_batch = {"a": [{"step": 4, "reward": 0.1, "hacpo/capability/a": 0.1}], "b": []}
    _plot(one_batch, ["a", "b"], str(tmp_path / "c.png"), {"a": [(0, 0.32), (4, 0.57)], "b": []}, temperature=1.0)
    assert (tmp_path / "c.png").stat().st_size > 0
    reward_ax, capability_ax = figures[0].axes
    lines = {line.get_label(): line for line in reward_ax.get_lines()}
    assert set(lines) == {"a: training reward (T = 1, own completions)", "a: held-out accuracy (greedy)"}
    assert list(lines["a: held-out accuracy (greedy)"].get_ydata()) == [0.32, 0.57]
    # a single generation batch is a visible point: every line is drawn with markers
    assert all(
        line.get_marker() not in (None, "None", "") for line in reward_ax.get_lines() + capability_ax.get_lines()
    )
    assert "greedy" in reward_ax.get_title() and "sampled" in reward_ax.get_title()
