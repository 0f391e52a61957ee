"""The `hacpo-train` entry point: recipe checks, every shipped recipe and accelerate config, and the CPU demo."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from hacpo_trl.launch.recipe import RecipeError, check_recipe, load_recipe
from helpers import accelerate_launch, hang_guard

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
GOOD = {
    "agents": [
        {"name": "a", "model_name_or_path": "builtin:tiny-llama"},
        {"name": "b", "model_name_or_path": "builtin:tiny-qwen2"},
    ],
    "reward_funcs": ["arithmetic_exact"],
}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"learnin_rate": 1e-6}, r"unknown recipe key 'learnin_rate'; did you mean 'learning_rate'\?"),
        ({"agents": None}, r"recipe key 'agents' is missing"),
        ({"agents": [{"name": "a"}]}, r"'agents.a.model_name_or_path' is missing"),
        ({"agents": [{"name": "a", "model_name_or_path": "x"}] * 2}, r"used more than once: \['a'\]"),
        ({"reward_funcs": ["accuracy"]}, r"unknown reward function 'accuracy'"),
        ({"task": "chess"}, r"'task' must be"),
        ({"task": "dataset"}, r"'dataset_name' is required"),
        (
            {
                "agents": [
                    {"name": "a", "model_name_or_path": "x", "output_dir": "o"},
                    {"name": "b", "model_name_or_path": "y", "output_dir": "o"},
                ]
            },
            "share an `output_dir`",
        ),
        (
            {  # b's default folder is <output_dir>/b, the folder a names explicitly
                "output_dir": "runs",
                "agents": [
                    {"name": "a", "model_name_or_path": "x", "output_dir": "runs/b"},
                    {"name": "b", "model_name_or_path": "y"},
                ],
            },
            r"agents 'a' and 'b' would both save to .*runs/b; give each its own `output_dir`",
        ),
        (  # refused by the config only when that agent's processes started; now by the recipe check (and --plan)
            {"agents": [{"name": "a", "model_name_or_path": "x", "overrides": {"temprature": 0.5}}]},
            r"recipe key 'agents': agent 'a': cannot override 'temprature' \(not a HACPOConfig field\)",
        ),
        (  # the config took the override, the plan and the vLLM-server check the field: now one value or an error
            {
                "agents": [
                    {"name": "a", "model_name_or_path": "x", "learn_from": "none", "overrides": {"learn_from": "all"}}
                ]
            },
            r"agent 'a' sets `learn_from` both as its own field and in `overrides`; keep one",
        ),
    ],
)
def test_bad_recipes_name_the_key(change, match):
    with pytest.raises(RecipeError, match=match):
        check_recipe({**GOOD, **change})


def test_a_recipe_without_reward_funcs_is_graded_by_its_tasks_own_reward(tmp_path):
    """Without `reward_funcs`, a recipe used to get the short-answer reward whatever its task: a correct worked
    solution of `arithmetic_trace` scored 0, and the run trained at reward 0 without a word. Each task's own now."""
    from trl import TrlParser

    from hacpo_trl.launch.recipe import HACPOScriptArguments
    from hacpo_trl.tasks.data import trace_solution
    from hacpo_trl.tasks.rewards import get_reward_funcs

    correct = {"arithmetic": "632", "arithmetic_trace": trace_solution(347, 285), "math": r"so \boxed{632}"}
    correct["arithmetic_trace_carries"] = trace_solution(347, 285)
    unnamed = {k: v for k, v in GOOD.items() if k != "reward_funcs"}
    for task, completion in correct.items():
        path = tmp_path / f"{task}.yaml"
        path.write_text(yaml.safe_dump({"task": task}))
        (args,) = TrlParser((HACPOScriptArguments,)).parse_args_and_config(["--config", str(path)])
        assert get_reward_funcs(args.reward_funcs)[0]([completion], answer=["632"]) == [1.0], (task, args)
        check_recipe({**unnamed, "task": task})
    assert HACPOScriptArguments(task="arithmetic_trace").reward_funcs == ["arithmetic_trace"]
    assert HACPOScriptArguments(task="arithmetic_trace", reward_funcs=["boxed_format"]).reward_funcs == ["boxed_format"]
    with pytest.raises(RecipeError, match=r"task 'dataset' has no reward of its own: set `reward_funcs`"):
        check_recipe({**unnamed, "task": "dataset", "dataset_name": "rows.jsonl"})


def test_held_out_evaluation_reports_each_half_of_a_task_with_halves(monkeypatch):
    """Before and after training, a task whose rows name their half is scored per half too (from the same
    completions, at the worked solutions' full length); the learning curve and any other task are scored as before."""
    from types import SimpleNamespace

    import hacpo_trl.evaluation.evaluate
    from hacpo_trl.evaluation.evaluate import EvalResult
    from hacpo_trl.launch.train import _evaluate
    from hacpo_trl.tasks.data import carry_trace_splits, trace_splits

    calls = []

    def fake(model, tok, data, reward, **kw):
        calls.append((len(data), kw["by"], kw["max_new_tokens"]))
        return EvalResult(0.3, 0.3, 1, len(data), {"carry": 0.5, "no_carry": 0.1} if kw["by"] else None)

    monkeypatch.setattr(hacpo_trl.evaluation.evaluate, "evaluate_model", fake)
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=0, unwrap_model=lambda m: m),
        model=None, processing_class=None, args=SimpleNamespace(max_completion_length=40, chat_template_kwargs=None),
    )  # fmt: skip
    halves = SimpleNamespace(eval_samples=500, reward_funcs=["arithmetic_trace"], task="arithmetic_trace_carries")
    plain = SimpleNamespace(eval_samples=500, reward_funcs=["arithmetic_trace"], task="arithmetic_trace")
    test = carry_trace_splits()["test"]
    assert _evaluate(trainer, test, halves, by_half=True) == (0.3, {"carry": 0.5, "no_carry": 0.1})
    assert _evaluate(trainer, test, halves) == 0.3  # the learning curve: overall only
    assert _evaluate(trainer, trace_splits()["test"], plain, by_half=True) == (0.3, None)
    assert calls == [(500, "half", 40), (500, None, 40), (500, None, 40)]
    trainer.accelerator.process_index = 1  # another rank of the agent reports nothing
    assert _evaluate(trainer, test, halves, by_half=True) == (None, None) and len(calls) == 3


def test_process_counts_must_fit_the_launch():
    check_recipe(GOOD, num_processes=2)
    with pytest.raises(RecipeError, match=r"add up to 2 \(a: 1, b: 1\) but the launch has 3"):
        check_recipe(GOOD, num_processes=3)


def test_a_key_given_twice_is_an_error(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("agents:\n  a: {model_name_or_path: x}\n  a: {model_name_or_path: y}\n")
    with pytest.raises(RecipeError, match=r"'a' is given twice \(line 3\)"):
        load_recipe(str(path))


@pytest.mark.launch
def test_cli_rejects_a_bad_recipe_before_loading_any_model(tmp_path):
    recipe = {**GOOD, "agents": [{"name": "a", "model_name_or_path": "builtin:tiny-llama"}], "learnin_rate": 1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.train", "--config", str(path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2
    assert "hacpo-train: error: unknown recipe key 'learnin_rate'; did you mean 'learning_rate'?" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1  # one line, no model load


def _launch_config(recipe_path: Path) -> Path:
    match = re.search(r"--config_file (\S+)", recipe_path.read_text())
    assert match, f"{recipe_path.name}: the header must show the launch command"
    return ROOT / match.group(1)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_is_valid_for_its_launch(path, tmp_path):
    from hacpo_trl import HACPOConfig
    from hacpo_trl.launch.recipe import HACPOScriptArguments

    text = path.read_text()
    assert text.startswith("#"), "each recipe starts with a comment: what, on what hardware, how long"
    recipe = load_recipe(str(path))
    launch = yaml.safe_load(_launch_config(path).read_text())
    check_recipe(recipe, num_processes=launch["num_processes"])
    # every setting is a valid HACPOConfig on this machine, checked with the first agent alone on one CPU process
    script_fields = set(HACPOScriptArguments.__dataclass_fields__)
    settings = {k: v for k, v in recipe.items() if k not in script_fields and k != "agents"}
    first = {**recipe["agents"][0], "num_processes": 1}
    settings.update(agents=[first], use_cpu=True, bf16=False, output_dir=str(tmp_path), report_to="none")
    cfg = HACPOConfig(**settings)
    assert cfg.agent_name == first["name"]
    # the paper's batching: 128 prompts x G per agent, 4 updates per step (GSPO and the preset on its schedule: 2)
    if recipe.get("task") == "math" and not path.stem.startswith("one_gpu_"):
        per_agent = recipe["agents"][0]["num_processes"]
        rows = recipe["per_device_train_batch_size"] * recipe["steps_per_generation"] * per_agent
        assert rows == 128 * recipe["num_generations"]
        updates = 2 if path.stem.endswith(("_gspo", "_preset")) else 4
        assert recipe["steps_per_generation"] // recipe["gradient_accumulation_steps"] == updates


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=[p.stem for p in ACCELERATE_CONFIGS])
def test_every_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    assert path.read_text().startswith("#"), "each accelerate config starts with a comment saying what it is for"
    config = load_config_from_file(str(path))
    assert config.num_processes >= 2 and config.num_processes % config.num_machines == 0


def _built(agent: str) -> dict:
    """What the session's cache holds for a built-in agent: its build record (steps, validation accuracy, band)."""
    from hacpo_trl.agents.demo import build_agent, build_record

    return build_record(build_agent(agent))


@pytest.mark.launch
@pytest.mark.timeout(2400)
def test_demo_trains_two_builtin_agents_end_to_end(tmp_path, builtin_cache):
    """The short-answer CPU demo recipe (`recipes/demo_cpu.yaml`, the quickstart notebook's; 120 steps, 300 held-out
    problems): built-in agents built, trained with HACPO for every step, evaluated before and after (the summary's
    numbers are its curve's two points), saved, loadable, plotted. Whether held-out accuracy rises is a draw of the
    run's sampling, not asserted here (the benchmark measures it over seeds); what is asserted holds for any draw: a
    generation batch whose rewards had a spread gave a learning signal, so the saved agent is no longer the built one."""
    from hacpo_trl.agents.demo import build_agent

    out = tmp_path / "demo"
    proc = accelerate_launch(
        2, "-m", "hacpo_trl.train", "--config", str(ROOT / "recipes" / "demo_cpu.yaml"), "--output_dir", str(out),
        timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    summary = json.loads((out / "hacpo_summary.json").read_text())
    assert sorted(summary) == ["tiny-llama", "tiny-qwen2"]
    built = {agent: {k: v for k, v in _built(agent).items() if k != "stages"} for agent in summary}
    steps = yaml.safe_load((ROOT / "recipes" / "demo_cpu.yaml").read_text())["max_steps"]
    for agent, info in summary.items():
        before, after = info["accuracy_before"], info["accuracy_after"]
        assert 0 <= before <= 1 and 0 <= after <= 1, (agent, info)
        # no `eval_every`: the curve is held-out accuracy before training (step 0) and after its last step
        assert info["curve"] == [[0, before], [steps, after]], (agent, info)
        assert f"{agent}: {out / agent}  held-out accuracy {before:.3f} -> {after:.3f}" in proc.stdout
        history = json.loads((out / agent / "log_history.json").read_text())
        assert [e["step"] for e in history if "loss" in e] == list(range(10, steps + 1, 10)), agent  # every step
        model = AutoModelForCausalLM.from_pretrained(out / agent)
        AutoTokenizer.from_pretrained(out / agent)
        assert type(model).__name__ == ("LlamaForCausalLM" if agent == "tiny-llama" else "Qwen2ForCausalLM")
        # a logged window with a group whose rewards differed (TRL's fraction of rows in zero-std groups below 1)
        # gave some own row an advantage != 0: the agent trained, its saved weights are not the built agent's
        spread = [e["frac_reward_zero_std"] for e in history if "frac_reward_zero_std" in e]
        assert len(spread) == steps // 10, agent
        start = AutoModelForCausalLM.from_pretrained(build_agent(agent)).state_dict()
        moved = any(not torch.equal(p, start[k]) for k, p in model.state_dict().items())
        assert moved or min(spread) == 1.0, (agent, spread, "built:", built[agent])
    # the warm start really gives one stronger agent: tiny-llama solves more held-out problems before training (bands
    # [0.45, 0.55] and [0.2, 0.3] on validation: 0.15 apart, far more than the sampling error of 300 problems). Not a
    # draw of the run: each agent is rebuilt bit for bit from its seed and evaluated greedily on fixed problems.
    before = {agent: info["accuracy_before"] for agent, info in summary.items()}
    assert before["tiny-llama"] > before["tiny-qwen2"] > 0, (before, "built:", built)
    assert (out / "hacpo_curves.png").stat().st_size > 10_000
    assert "held-out accuracy before training" in proc.stdout
    assert str(out / "tiny-llama") in proc.stdout


@pytest.mark.parametrize("agent", ["tiny-llama", "tiny-qwen2"])
def test_builtin_agent_is_built_into_its_validation_band(agent, builtin_cache):
    """Every machine builds an agent of the same strength: the warm-start stops at the first check inside the agent's
    band and records where; the saved agent scores that accuracy on the validation rows again."""
    from hacpo_trl.agents.demo import BUILTIN_AGENTS, build_agent, validation_rows
    from hacpo_trl.evaluation.evaluate import evaluate_model
    from hacpo_trl.tasks.rewards import arithmetic_exact_match

    spec, record = BUILTIN_AGENTS[agent], _built(agent)
    low, high = spec.band
    assert record["agent"] == agent and record["band"] == [low, high]
    assert low <= record["validation_accuracy"] <= high, record
    assert 0 < record["steps"] <= spec.max_steps and record["validation_size"] == 200, record
    folder = build_agent(agent)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as it was built
    try:
        again = evaluate_model(model, tok, validation_rows(spec.task), arithmetic_exact_match, max_new_tokens=6)
    finally:
        torch.set_num_threads(threads)
    assert again.n == 200 and again.avg_at_k == pytest.approx(record["validation_accuracy"], abs=0.02), record


def test_builtin_agents_rebuild_identically_from_their_seed(tmp_path, builtin_cache):
    """The demo's agents are not shipped: every machine builds them from a seed, and must get the same weights."""
    from safetensors.torch import load_file

    from hacpo_trl.agents.demo import build_agent

    cached = Path(build_agent("tiny-qwen2"))  # the session's cache (built by the demo test, or now)
    fresh = Path(build_agent("tiny-qwen2", str(tmp_path / "fresh")))
    assert cached != fresh
    a, b = load_file(cached / "model.safetensors"), load_file(fresh / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_processes_that_need_the_same_agent_build_it_once(tmp_path, monkeypatch, capsys):
    """Every process of a launch (and every test worker) resolves its agents: the first builds, the others wait for
    it and reuse its folder instead of building the same agent again on the same cores."""
    import threading

    from hacpo_trl.agents import demo

    building, release, calls, folders = threading.Event(), threading.Event(), [], []

    def fake_build(name, spec, folder):
        calls.append(name)
        building.set()
        assert release.wait(hang_guard(120))
        os.makedirs(folder)
        Path(folder, "config.json").write_text("{}")

    monkeypatch.setattr(demo, "_build", fake_build)
    directory = str(tmp_path / "agent")
    first = threading.Thread(target=lambda: folders.append(demo.build_agent("tiny-llama", directory)))
    first.start()
    assert building.wait(hang_guard(120))
    second = threading.Thread(target=lambda: folders.append(demo.build_agent("tiny-llama", directory)))
    second.start()
    seen = ""
    while "waiting for another process that is building agent" not in seen and second.is_alive() and len(calls) == 1:
        seen += capsys.readouterr().err
        second.join(0.05)
    assert second.is_alive(), "the second process did not wait for the build"
    release.set()
    first.join(hang_guard(120))
    second.join(hang_guard(120))
    assert calls == ["tiny-llama"] and folders == [directory, directory]


@pytest.mark.parametrize("tool", ["hacpo-train", "--plan", "hacpo-probe"])
def test_a_resume_folder_without_a_checkpoint_is_refused_with_the_recipe_before_any_model_loads(
    tool, tmp_path, capsys, monkeypatch
):
    """`--resume_from_checkpoint` at a folder holding no checkpoint: one `<tool>: error:` line naming the folder and
    the fix, from the recipe checks, before any agent is built or evaluated (the training summary's 'before'
    evaluation never runs)."""
    empty = tmp_path / "empty_ckpt"
    empty.mkdir()
    prog, err = _refused(tool, ["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(empty)],
                         capsys, monkeypatch)  # fmt: skip
    line = next(x for x in err if x.startswith(f"{prog}: error:"))
    assert f"recipe key 'resume_from_checkpoint': resume_from_checkpoint '{empty}' is not a checkpoint folder" in line
    assert "pass `true` to resume every agent from the newest step all of them saved" in line


def _refused(tool: str, flags: list[str], capsys, monkeypatch) -> tuple[str, list[str]]:
    """``tool`` (hacpo-train, its --plan or hacpo-probe, run bare) on recipes/tiny_size.yaml with ``flags``, refused:
    exit status 2, no agent built, no traceback. Returns the tool's name in its error line and the stderr lines."""
    from hacpo_trl.launch import plan_cli, probe, train

    monkeypatch.delenv("RANK", raising=False)
    built = []
    monkeypatch.setattr("hacpo_trl.agents.builtin.resolve_model", lambda name: built.append(name) or name)
    run = {"hacpo-train": train.main, "--plan": lambda a: plan_cli.main([*a, "--plan"]), "hacpo-probe": probe.main}
    assert run[tool](["--config", str(ROOT / "recipes" / "tiny_size.yaml"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not built and "Traceback" not in "\n".join(err)
    return ("hacpo-train --plan" if tool == "--plan" else tool), err


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("vllm") is not None, reason="vLLM is installed in this environment"
)
@pytest.mark.parametrize("where", ["run", "agent"])
def test_use_vllm_without_vllm_is_refused_before_any_agent_is_built(where, tmp_path, capsys, monkeypatch):
    """`recipes/tiny_vllm.yaml` in the default venv: one line naming the install, before any agent is built (it built
    `vllm-llama`, then died with a raw ModuleNotFoundError); an agent's own `use_vllm` override counts too."""
    from hacpo_trl.launch import train

    monkeypatch.delenv("RANK", raising=False)
    built = []
    monkeypatch.setattr("hacpo_trl.agents.builtin.resolve_model", lambda name: built.append(name) or name)
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny_vllm.yaml").read_text())
    if where == "agent":
        recipe["use_vllm"] = False
        recipe["agents"][1]["overrides"] = {"use_vllm": True}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert train.main(["--config", str(path), "--output_dir", str(tmp_path / "run")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    agents = "'vllm-llama', 'vllm-qwen2'" if where == "run" else "'vllm-qwen2'"
    assert line.startswith(f"hacpo-train: error: recipe key 'use_vllm': agent(s) {agents} generate with vLLM")
    assert "make install-vllm" in line and not built


@pytest.mark.parametrize("tool", ["hacpo-train", "--plan", "hacpo-probe"])
def test_a_malformed_flag_value_is_one_line_naming_the_flag(tool, tmp_path, capsys, monkeypatch):
    """`--model_init_kwargs '{"dtype": bfloat16'` (a closing brace lost): flag values are read as YAML, and the
    parser's error used to escape as a 40-line `yaml.parser.ParserError` traceback, on every rank of a launch. Now the
    one `<tool>: error:` line names the flag and what is wrong with its value, before any agent is built."""
    flags = ["--output_dir", str(tmp_path / "run"), "--model_init_kwargs", '{"dtype": bfloat16']
    prog, err = _refused(tool, flags, capsys, monkeypatch)
    assert err[-1] == (
        f"""{prog}: error: flag --model_init_kwargs: malformed value '{{"dtype": bfloat16': expected ',' or '}}', """
        "but got '<stream end>' (column 19)"
    )
