"""What a newcomer meets on the first day: an error that says which values would fit, a build that shows it is
alive, a plan that says what to change."""

import io

import pytest

from hacpo_trl import HACPOConfig
from hacpo_trl.run.schedule import generation_groups_problem

COMMON = dict(use_cpu=True, bf16=False, report_to="none")


def test_a_batch_that_splits_prompt_groups_names_the_values_that_fit(tmp_path):
    """TRL says only that 64 is not divisible by 12; the error names where 64 comes from and what would fit."""
    with pytest.raises(ValueError) as caught:
        HACPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=32, steps_per_generation=2,
                    num_generations=12, **COMMON)  # fmt: skip
    assert str(caught.value) == (
        "generation_batch_size 64 (per_device_train_batch_size 32 x 1 process(es) x steps_per_generation 2) must be "
        "a multiple of num_generations 12, so that every prompt's completions fall in one batch: use num_generations "
        "2, 4, 8, 16, 32 or 64, or per_device_train_batch_size 30 or 36 (generation_batch_size 60 or 72)"
    )
    assert generation_groups_problem(32, 1, 2, 8) is None
    # every value it offers fits
    assert generation_groups_problem(8, 2, 4, 3).endswith(
        "use num_generations 2, 4, 8, 16, 32 or 64, or per_device_train_batch_size 6 or 9 (generation_batch_size 48 "
        "or 72)"
    )
    for per_device in (6, 9):
        assert generation_groups_problem(per_device, 2, 4, 3) is None
    # a batch of one prompt's worth: only a larger micro-batch fits
    assert generation_groups_problem(1, 1, 1, 3).endswith("use per_device_train_batch_size 3 (generation_batch_size 3)")


def test_a_build_says_where_it_stands_at_most_every_30_seconds():
    from hacpo_trl.agents.demo import BUILTIN_AGENTS, BuildProgress

    now = [0.0]
    out = io.StringIO()
    progress = BuildProgress("trace-large", BUILTIN_AGENTS["trace-large"], clock=lambda: now[0], out=out)
    for step, seconds in ((10, 12.0), (20, 29.0), (30, 31.0), (40, 45.0), (50, 61.5), (60, 125.0)):
        now[0] = seconds
        progress.update(step, step / 200)
    assert out.getvalue().splitlines() == [
        "hacpo: building 'trace-large': step 30 (cap 3000), sampled accuracy 0.150, band [0.2, 0.3], 0m31s so far",
        "hacpo: building 'trace-large': step 50 (cap 3000), sampled accuracy 0.250, band [0.2, 0.3], 1m01s so far",
        "hacpo: building 'trace-large': step 60 (cap 3000), sampled accuracy 0.300, band [0.2, 0.3], 2m05s so far",
    ]


PRESET = ["--peer_filter", "correct", "--peer_prompts", "failed", "--taught_ratio_floor", "0.2", "--taught_schedule",
          "solo", "--taught_scale", "0.25", "--band_gate", "true", "--solo_steps_per_generation", "2"]  # fmt: skip


def _one_gpu_math_plan(*flags: str):
    from pathlib import Path

    from hacpo_trl.launch.plan_cli import build_plan
    from hacpo_trl.launch.recipe import load_recipe

    root = Path(__file__).resolve().parents[1]
    args = ["--task", "math", "--reward_funcs", "math_verify", *PRESET, *flags]
    recipe = load_recipe(str(root / "recipes" / "one_gpu_qwen3_shapes.yaml"), args)
    return build_plan(recipe, str(root / "accelerate_configs" / "one_gpu_2agents.yaml"), 79.2, 7500, 1)


def test_a_plan_that_does_not_fit_says_the_nearest_change_of_each_kind_that_fits():
    """The one-GPU shapes pair on `task: math` with the preset needs more than an 80 GB GPU; `--plan` says which
    micro-batch, completion length or placement fits, and each of them, planned on its own, does."""
    from hacpo_trl.planning.plan import format_plan

    plan = _one_gpu_math_plan()
    assert not plan.ok and len(plan.fixes) == 3
    batch, length, placement = plan.fixes
    assert batch.startswith(
        "per_device_train_batch_size 16 -> 8, steps_per_generation 4 -> 8, gradient_accumulation_steps 1 -> 2, "
        "solo_steps_per_generation 2 -> 4 (the same generation batch and updates, smaller forward passes): "
    )
    assert length.startswith("max_completion_length 512 -> 320: ")
    assert placement.startswith("a GPU per process (share_gpus: false, 2 GPUs): ")
    assert format_plan(plan).splitlines()[-3:] == [f"plan: to fit, {f}" for f in plan.fixes]
    smaller = ["--per_device_train_batch_size", "8", "--steps_per_generation", "8", "--gradient_accumulation_steps",
               "2", "--solo_steps_per_generation", "4"]  # fmt: skip
    for flags in (smaller, ["--max_completion_length", "320"], ["--share_gpus", "false"]):
        fitted = _one_gpu_math_plan(*flags)
        assert fitted.ok and fitted.fixes == [], (flags, fitted.problems)
    assert not _one_gpu_math_plan("--max_completion_length", "384").ok  # 320 is the nearest that fits (by 64s)


def test_readme_and_makefile_state_the_same_time_for_make_test_fast():
    """The README said ~3 min and the Makefile about 2 minutes for one target: they name one range, with the load."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = " ".join((root / "README.md").read_text().replace("#", " ").split())
    makefile = " ".join((root / "Makefile").read_text().replace("#", " ").split())
    said = re.search(
        r"make test-fast: no launches, (\d+)[–-](\d+) min on 2 cores .*?\(load average (\d+)[–-](\d+)\)", readme
    )
    made = re.search(r'`-m "not launch"`.*?: (\d+)-(\d+) minutes on 2 cores .*?\(load average (\d+)-(\d+)\)', makefile)
    assert said and made and said.groups() == made.groups()
