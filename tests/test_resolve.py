"""`hacpo_trl.run.resolve`: the one reading of a recipe's agents (entries, settings over the run's, output folders)."""

import os
import subprocess
import sys

import pytest

from hacpo_trl.run.resolve import AgentSpec, resolve

TWO = [{"name": "a", "model_name_or_path": "x"}, {"name": "b", "model_name_or_path": "y"}]


def test_a_list_and_a_mapping_of_agents_resolve_alike():
    as_list = resolve({"output_dir": "run", "agents": TWO})
    as_mapping = resolve(
        {"output_dir": "run", "agents": {"a": {"model_name_or_path": "x"}, "b": {"model_name_or_path": "y"}}}
    )
    as_json = resolve(
        {"output_dir": "run", "agents": '{"a": {"model_name_or_path": "x"}, "b": {"model_name_or_path": "y"}}'}
    )
    assert as_list == as_mapping == as_json
    assert as_list.names == ["a", "b"] and as_list.process_counts == [1, 1] and as_list.several


def test_an_agents_settings_are_the_runs_then_its_own_fields_then_its_overrides():
    recipe = {
        "learning_rate": 1e-6,
        "peer_filter": "all",
        "weight_decay": 0.0,
        "agents": [
            {"name": "a", "learning_rate": 3e-6, "overrides": {"peer_filter": "correct", "weight_decay": 0.1}},
            {"name": "b", "learn_from": "none"},
        ],
    }
    a, b = resolve(recipe).agents
    assert (a.get("learning_rate"), a.get("peer_filter"), a.get("weight_decay")) == (3e-6, "correct", 0.1)
    assert (b.get("learning_rate"), b.get("peer_filter"), b.get("learn_from")) == (1e-6, "all", "none")
    assert dict(a.own_settings) == {
        "learning_rate": 3e-6,
        "peer_filter": "correct",
        "weight_decay": 0.1,
        "output_dir": os.path.join("hacpo_output", "a"),
    }
    assert b.get("capability_gate", 0.0) == 0.0  # neither the run nor the agent gives it: the caller's default
    with pytest.raises(TypeError):
        a.settings["peer_filter"] = "all"  # read-only: one resolution, the same for every reader


def test_output_folders_are_derived_once():
    """One agent saves into the run's folder; several into <output_dir>/<name> (hacpo_output when unset), unless
    an agent names its own."""
    one = resolve({"output_dir": "run", "agents": TWO[:1]})
    assert (one.output_dir, one.agents[0].output_dir) == ("run", "run")
    assert resolve({"agents": TWO[:1]}).agents[0].output_dir is None
    several = resolve({"agents": [TWO[0], {**TWO[1], "output_dir": "elsewhere"}]})
    assert several.output_dir == "hacpo_output"
    assert [a.output_dir for a in several.agents] == [os.path.join("hacpo_output", "a"), "elsewhere"]
    assert several.agents[1].get("output_dir") == "elsewhere"


@pytest.mark.parametrize(
    "recipe, match",
    [
        ({}, r"`agents` is missing"),
        ({"agents": []}, r"non-empty"),
        ({"agents": {"a": 3}}, r"agent 'a' must be a mapping of settings, got 3"),
        ({"agents": ["a"]}, r"each agent must be a mapping of settings, got 'a'"),
        ({"agents": {"a": {"name": "b"}}}, r"agent 'a' has a different `name` inside: 'b'"),
        ({"agents": [{"name": "a", "modle": "x"}]}, r"agent 'a': unknown key\(s\) \['modle'\]"),
        ({"agents": [{"name": "a"}, {"name": "a"}]}, r"used more than once: \['a'\]"),
        ({"agents": [{"name": "a", "overrides": {"output_dir": "o"}}]}, r"cannot override 'output_dir' \(set it on"),
        ({"agents": [{"name": "a", "overrides": {"_specs": 1}}]}, r"cannot override '_specs' \(not a HACPOConfig"),
        (
            {"agents": [{"name": "a", "vllm_group_port": 1, "overrides": {"vllm_group_port": 2}}]},
            r"agent 'a' sets `vllm_group_port` both as its own field and in `overrides`",
        ),
        (
            {"output_dir": "r", "agents": [{"name": "a", "output_dir": "r/b"}, {"name": "b"}]},
            r"agents 'a' and 'b' would both save to .*r/b; give each its own `output_dir`",
        ),
    ],
)
def test_a_bad_agents_key_is_refused_naming_the_agent_and_the_fix(recipe, match):
    with pytest.raises(ValueError, match=match):
        resolve(recipe)


def test_override_names_are_checked_against_the_fields_given():
    agents = [{"name": "a", "overrides": {"temprature": 0.5}}]
    resolve({"agents": agents})  # no field list (before TRL is imported): left to the checks that have one
    with pytest.raises(ValueError, match=r"agent 'a': cannot override 'temprature' \(not a HACPOConfig field\)"):
        resolve({"agents": agents}, fields={"temperature"})


def test_a_recipe_without_agents_gets_the_default_agent():
    resolved = resolve({"output_dir": "run"}, default=AgentSpec(name="policy", num_processes=4))
    assert resolved.names == ["policy"] and resolved.process_counts == [4]
    assert not resolved.several and resolved.agents[0].output_dir == "run"


def test_the_placement_reads_process_counts_through_the_resolver():
    from hacpo_trl.run.placement import process_counts

    assert process_counts({"agents": [TWO[0], {**TWO[1], "num_processes": 3}]}) == [1, 3]
    assert process_counts({"agents": {"a": None, "b": {"num_processes": 2}}}) == [1, 2]
    for unclear in ({}, {"agents": [{"name": "a", "num_processes": 0}]}, {"agents": [{"name": "a"}] * 2}):
        assert process_counts(unclear) is None  # the recipe check says what is wrong


def test_resolving_and_the_checks_before_ml_libraries_stay_torch_free():
    """The placement runs before anything may initialise CUDA, and every rank's pre-flight checks must take a second:
    resolving a recipe, the placement's reading and the pre-flight checks import no torch, trl or transformers."""
    code = (
        "import sys\n"
        "from hacpo_trl.run.resolve import resolve\n"
        "from hacpo_trl.run.placement import process_counts\n"
        "from hacpo_trl.launch.recipe import check_output_dir, preflight\n"
        "recipe = {'agents': [{'name': 'a', 'model_name_or_path': 'builtin:tiny-llama', 'overrides': {'peer_filter': "
        "'correct'}}, {'name': 'b', 'model_name_or_path': 'builtin:tiny-qwen2'}], 'reward_funcs': ['arithmetic_exact']}\n"
        "assert resolve(recipe).agents[0].get('peer_filter') == 'correct'\n"
        "assert process_counts(recipe) == [1, 1]\n"
        "preflight(recipe, 2); check_output_dir(recipe)\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
