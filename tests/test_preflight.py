"""Bad inputs of a first launch: each is refused before any ML library is imported,
with exactly one `hacpo-train: error:` line naming the problem, however the two ranks of a launch race."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacpo_trl.launch.recipe import RecipeError, load_recipe, numbers_as_values, preflight
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


def _launch(tmp: Path, change, flags, size, combined: bool = False) -> subprocess.Popen:
    path = _write(tmp, change)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"),
        "--num_processes", str(size), "--main_process_port", str(free_port()),
        "-m", "hacpo_trl.train", "--config", str(path), *flags,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HACPO_ERROR_WAIT": "120"}
    stderr = subprocess.STDOUT if combined else subprocess.PIPE
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


def _first_and_last(output: str) -> tuple[list[str], str]:
    """The `hacpo-train: error:` lines before the launcher's traceback, and the last non-empty line of all."""
    before = output.split("Traceback (most recent call last)")[0]
    errors = [line for line in before.splitlines() if "hacpo-train: error:" in line]
    return errors, ([line for line in output.splitlines() if line.strip()] or [""])[-1]


@pytest.mark.launch
def test_every_bad_input_gives_one_line_in_a_real_two_process_launch(tmp_path):
    """Every case of the table launched for real (the racy ones three times), four launches at a time: each exits
    with the launcher's status 1 (a child exited 2) and prints exactly one `hacpo-train: error:` line naming the
    problem before the launcher's traceback, and the same line once more after it, as the last line. The other
    ranks wait for the launcher's stop instead of exiting first (see `hacpo_trl.launch.bootstrap.refuse`)."""
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
            first, last = _first_and_last(err)
            if (
                proc.returncode != 1
                or len(first) != 1
                or expected not in first[0]
                or lines != [first[0], first[0]]
                or last != first[0]
                or "Traceback" in err.split("hacpo-train: error:")[0]
            ):
                failures.append((name, proc.returncode, lines, err[-1500:]))
    assert not failures, failures


def test_an_error_after_the_agent_worlds_are_split_is_printed_once_and_last(tmp_path):
    """`solo_steps_per_generation` is checked by `HACPOConfig`, after the launch is split into agent worlds, where
    every agent has a rank 0 (RANK is agent-local): both agents printed the line, and the other agent, stopped by
    the launcher, added a line blaming no one. Now: the line once from the ranks, once more as the last line of the
    combined output (after the launcher's traceback), nothing else of ours."""
    proc = _launch(tmp_path, {}, ["--solo_steps_per_generation", "3"], 2, combined=True)
    out, _ = proc.communicate(timeout=600)
    first, last = _first_and_last(out)
    expected = "hacpo-train: error: `solo_steps_per_generation` must be an integer >= 1 that divides"
    assert proc.returncode == 1, out[-3000:]
    assert len(first) == 1 and first[0].startswith(expected), out[-3000:]
    assert last == first[0], out[-3000:]
    ours = [line for line in out.splitlines() if line.startswith(("hacpo-train:", "hacpo:"))]
    assert ours == [first[0], first[0]], out[-3000:]


def test_an_output_folder_holding_a_run_is_refused_unless_overwrite_or_resume(tmp_path):
    from hacpo_trl.launch.recipe import check_output_dir

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
    code = "import sys; from hacpo_trl.launch.train import main; main(['--help']); print('trl imported:', 'trl' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    out = proc.stdout
    assert out.startswith("usage: hacpo-train --config RECIPE")
    for needed in ("--config", "--plan", "--accelerate_config", "--gpu_memory_gib", "--help-all", "arithmetic_trace"):
        assert needed in out, needed
    for reward in ("arithmetic_exact", "math_verify", "boxed_format", "module:function"):
        assert reward in out, reward
    assert "--peer_delta" in out and "--alpha" in out  # HACPO's own settings, read from HACPOConfig's source
    assert len(out.splitlines()) < 120 and out.strip().endswith("trl imported: False")


def test_help_points_to_readme_sections_that_exist_and_quotes_the_plans_card_memory(capsys):
    from hacpo_trl.launch.train import main
    from hacpo_trl.planning.plan import DEVICE_GIB

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    sentence = out.split("see README", 1)[1].split(".\n", 1)[0]
    named = re.findall(r'"([^"]+)"', sentence)
    headings = {line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line[:1] == "#"}
    assert named and all(name in headings for name in named), (named, sorted(headings))
    assert f"(80 GB cards: {DEVICE_GIB})" in out  # what --plan assumes without --gpu_memory_gib


def test_curves_after_one_generation_batch_show_markers_and_held_out_accuracy(tmp_path, monkeypatch):
    import matplotlib.figure

    from hacpo_trl.launch.train import _plot

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


@pytest.mark.launch
def test_an_agent_that_cannot_start_ends_the_run_with_one_line_naming_it(tmp_path):
    """A failure after start-up (here the first agent's folder holds a config.json that is not JSON: it passes the
    checks, which read no model files, and fails in from_pretrained): the run still ends with the one
    `hacpo-train: error:` line naming the agent and the cause, as its last line, not a traceback per rank. (An
    agent on another global rank than 0 prints it after HACPO_ERROR_WAIT, as `refuse` does.)"""
    folder = tmp_path / "broken-model"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    agents = [{"name": "tiny-qwen2", "model_name_or_path": str(folder)}, GOOD["agents"][0]]
    proc = _launch(tmp_path, {"agents": agents}, [], 2, combined=True)
    out, _ = proc.communicate(timeout=600)
    first, last = _first_and_last(out)
    assert proc.returncode == 1, out[-3000:]
    assert last.startswith("hacpo-train: error: agent 'tiny-qwen2' could not start: "), out[-3000:]
    assert "config.json" in last and last in first, out[-3000:]
