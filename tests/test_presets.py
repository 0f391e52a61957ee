"""Named sharing modes (`sharing: recommended`): one expansion, read alike by the recipe, the config, the plan and the
probe; a setting beside the name wins; the benchmark's preset methods are the names' settings."""

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from hacpo_trl import HACPOConfig
from hacpo_trl.launch.probe import band_gate_keeps, learner_view
from hacpo_trl.launch.recipe import RecipeError, load_recipe
from hacpo_trl.planning.plan import Launch, ModelDims, format_plan, make_plan
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.run.resolve import resolve
from hacpo_trl.sharing.decision import PeerDecision, SharingSettings, decide, peers_in_band, rescued_prompts
from hacpo_trl.sharing.presets import SHARING_CHANGES, SHARING_PRESETS, describe_sharing, expand_sharing

ROOT = Path(__file__).resolve().parents[1]
COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)


def test_a_name_expands_to_its_settings_and_a_setting_beside_it_wins():
    assert expand_sharing({})["sharing"] == "paper" and expand_sharing({})["peer_prompts"] == "all"
    out = expand_sharing({"sharing": "recommended", "taught_cap": 0, "band_gate": False})
    keys = (
        "peer_filter",
        "peer_prompts",
        "taught_schedule",
        "taught_ratio_floor",
        "taught_failed_rate",
        "taught_scale",
    )
    assert {k: out[k] for k in keys} == {
        "peer_filter": "correct", "peer_prompts": "failed", "taught_schedule": "solo", "taught_ratio_floor": 0.2,
        "taught_failed_rate": 0.125, "taught_scale": 1.0,
    }  # fmt: skip
    assert out["taught_cap"] == 0 and out["band_gate"] is False  # given beside it, even the paper's value
    assert "solo_steps_per_generation" not in out  # the recipe's own schedule: nothing skipped
    assert expand_sharing({"sharing": "none"})["share_rollouts"] is False
    with pytest.raises(
        ValueError,
        match=r"must be one of 'paper', 'recommended', 'none', got 'recomended'; did you mean 'recommended'\?$",
    ):
        expand_sharing({"sharing": "recomended"})
    with pytest.raises(ValueError, match=r"got 'quarter_weight'$"):  # the benchmark's screened settings are not modes
        expand_sharing({"sharing": "quarter_weight"})
    line = describe_sharing(out)
    assert (
        line.startswith("sharing: recommended (") and "taught_cap 0 (set)" in line and "band_gate false (set)" in line
    )


def test_the_papers_settings_are_the_defaults_of_the_learners_settings():
    defaults = {f.name: f.default for f in dataclasses.fields(SharingSettings)}
    paper = {k: v for k, v in SHARING_PRESETS["paper"].items() if k != "share_rollouts"}
    assert {k: defaults[k] for k in paper} == paper


def test_the_config_expands_the_name_and_keeps_what_is_set_beside_it(tmp_path):
    cfg = HACPOConfig(output_dir=str(tmp_path), sharing="recommended", taught_scale=0.5, **COMMON)
    assert (cfg.sharing, cfg.peer_prompts, cfg.taught_schedule, cfg.taught_cap, cfg.taught_scale) == (
        "recommended",
        "failed",
        "solo",
        3,
        0.5,
    )
    assert cfg.sharing_settings().band_gate is True
    plain = HACPOConfig(output_dir=str(tmp_path), **COMMON)
    assert (plain.sharing, plain.share_rollouts, plain.peer_filter, plain.band_gate) == ("paper", True, "all", False)


def test_recipe_and_command_line_expand_alike_and_an_agent_cannot_name_a_mode(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"sharing": "recommended", "agents": [{"name": "a"}, {"name": "b"}]}))
    assert load_recipe(str(path))["peer_prompts"] == "failed"
    flags = load_recipe(str(path), ["--sharing", "paper", "--peer_filter", "correct"])
    assert (flags["sharing"], flags["peer_prompts"], flags["peer_filter"]) == ("paper", "all", "correct")
    path.write_text(yaml.safe_dump({"sharing": "best", "agents": [{"name": "a"}]}))
    with pytest.raises(RecipeError, match="recipe key 'sharing': `sharing` must be one of"):
        load_recipe(str(path))
    agents = [{"name": "a", "overrides": {"sharing": "recommended"}}, {"name": "b"}]
    with pytest.raises(ValueError, match="`sharing` names the run's mode; override its settings instead"):
        resolve({"agents": agents})


def test_the_public_modes_are_three_and_rule_17s_choice_is_the_recommended_one():
    """A user picks the paper's rule, the recommended preset or no sharing; what the benchmark screened and did not
    adopt lives in the benchmark (`reproduce.SCREENED_SHARING`). `recommended` is rule 17's candidate B:
    `failed_prompts` (rule 13) with `taught_cap: 3` (A) and `taught_failed_rate: 0.125`; each makes a learner's
    checked settings, and the card line names what it changes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    assert list(SHARING_PRESETS) == ["paper", "recommended", "none"]
    screened = reproduce.SCREENED_SHARING
    assert screened["capped_taught"] == {**screened["failed_prompts"], "taught_cap": 3}
    assert screened["capped_almost_failed"] == {**screened["capped_taught"], "taught_failed_rate": 0.125}
    assert SHARING_CHANGES["recommended"] == screened["capped_almost_failed"]
    assert screened["capped_mostly_failed"] == {**screened["capped_taught"], "taught_failed_rate": 0.25}
    assert screened["quarter_weight"] == {**screened["failed_prompts"], "taught_scale": 0.25}
    values = {**expand_sharing({"sharing": "recommended"}), "naive": False, "peer_clipping": True}
    settings = SharingSettings.from_values({**values, "capability_metric": "accuracy"})
    assert (settings.taught_cap, settings.taught_failed_rate, settings.taught_scale) == (3, 0.125, 1.0)
    assert describe_sharing(values).endswith("taught_cap 3, taught_failed_rate 0.125, band_gate true")
    assert SHARING_PRESETS["paper"]["taught_cap"] == 0 and SHARING_PRESETS["paper"]["taught_failed_rate"] == 0


def test_the_benchmarks_preset_methods_are_the_names_settings():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    schedule = {*reproduce.HACPO_SCHEDULE, *reproduce.SOLO}
    for name, method in reproduce.PRESET_METHODS.items():
        settings = {k: v for k, v in reproduce.METHODS[method][0].items() if k not in schedule}
        assert settings == reproduce.SHARING_SETTINGS[name], name
    assert reproduce.PRESET_METHODS["recommended"] == reproduce.RECOMMENDED


def _plan(recipe: dict):
    tiny = ModelDims(hidden=64, layers=2, intermediate=128, heads=4, kv_heads=4, head_dim=16, vocab=32,
                     max_position=256, tied=True)  # fmt: skip
    dims = {"a": tiny, "b": tiny}
    return make_plan(recipe, dims, Launch("cpu", num_processes=2), None)


def test_a_recipe_plus_the_preset_line_has_the_recipes_gspo_schedule_and_skips_nothing():
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny_size.yaml").read_text())
    recipe["agents"] = [{"name": "a", "model_name_or_path": "x"}, {"name": "b", "model_name_or_path": "y"}]
    gspo = _plan({**recipe, "sharing": "none"})
    preset = _plan({**recipe, "sharing": "recommended"})
    for g, p in zip(gspo.agents, preset.agents, strict=True):
        keys = ("updates_per_generation", "steps_per_generation", "own_completions_per_rank")
        assert {k: g.batch[k] for k in keys} == {k: p.batch[k] for k in keys}
        assert p.batch["gspo_schedule"] and p.batch["solo_steps_per_generation"] is None
    assert gspo.schedule["total_steps"] == preset.schedule["total_steps"] == recipe["max_steps"]
    text = format_plan(preset)
    assert text.count("4 optimizer updates per generation batch, as GSPO with this recipe: 16 own rows each, none skip")
    assert "sharing: recommended (" in text and "skipped (solo_steps_per_generation" not in text


def _records(rewards: dict[str, dict[str, list[float]]]) -> list[RolloutBatch]:
    return [
        RolloutBatch(agent, 0, 0, [pid for pid, rs in by_prompt.items() for _ in rs],
                     rewards=[r for rs in by_prompt.values() for r in rs])
        for agent, by_prompt in rewards.items()
    ]  # fmt: skip


# "weak" fails p1 entirely, which "strong" solves; "strong" fails p2 entirely, which "weak" solves
RECORDS = _records({
    "weak": {"p1": [0.0, 0.0], "p2": [1.0, 0.0], "p3": [1.0, 0.0]},
    "strong": {"p1": [1.0, 0.0], "p2": [0.0, 0.0], "p3": [1.0, 1.0]},
})  # fmt: skip
# per mode, (learns_from, taught, rescued) of the weaker and of the stronger learner (capabilities 0.2 and 0.6)
MODES = {
    "paper": ({}, (["strong"], {}, {}), (["weak"], {}, {})),
    "recommended": ({"sharing": "recommended"}, (["strong"], {"strong": ["p1"]}, {}), (["weak"], {"weak": ["p2"]}, {})),
    "better": ({"peer_prompts": "better"}, (["strong"], {"strong": ["p1", "p3"]}, {}), (["weak"], {"weak": ["p2"]}, {})),
    "gate": ({"capability_gate": 1.0}, (["strong"], {}, {}), ([], {}, {})),
    "rescue": (
        {"capability_gate": 1.0, "capability_gate_rescue": True}, (["strong"], {}, {}), (["weak"], {}, {"weak": ["p2"]}),
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_the_probes_view_is_the_trainers_decision_on_the_same_batch(mode):
    """The probe reports what `decide` decides with the batch's records, as the trainer calls it: under per-prompt
    sharing each learner is taught the prompts it failed entirely and its peer solved (called without the records,
    as the probe once called it, per-prompt sharing learns from no one)."""
    settings, *expected = MODES[mode]
    values = expand_sharing({**settings, "naive": False, "peer_clipping": True, "capability_metric": "accuracy"})
    sharing = SharingSettings.from_values(values)
    caps, rows = {"weak": 0.2, "strong": 0.6}, {"weak": 6, "strong": 6}
    for learner, want in zip(("weak", "strong"), expected, strict=True):
        decision = decide(sharing, learner, ["weak", "strong"], caps, rows, 3, 0, RECORDS, True)
        view = learner_view(decision)
        assert (view["learns_from"], view["taught"], view["rescued"]) == want, learner
        assert view["learns_from"] == list(decision.involved)
    if mode == "recommended":
        assert rescued_prompts(RECORDS, "weak", ["strong"]) == {"strong": {"p1"}}
        assert learner_view(decide(sharing, "weak", ["weak", "strong"], caps, rows, 3, 0))["learns_from"] == []


def test_the_probes_band_gate_verdict_is_the_trainers_rule():
    """A taught row counts at or above the floor, a band row inside [lb, 1]: the probe closes a peer exactly when
    the trainer's `peers_in_band` counts none of its rows."""
    import torch

    for ratios, taught in (
        ([0.1, 0.15], [True, True]),
        ([0.3], [True]),
        ([1.2, 0.5], [False, False]),
        ([0.9], [False]),
    ):
        counted = peers_in_band(torch.tensor(ratios), ["p"] * len(ratios), ["p"], 0.8, taught, 0.2)["p"]
        assert band_gate_keeps(ratios, taught, 0.8, 0.2) == (counted > 0)
        closed = PeerDecision(("p",), taught=frozenset({"p"})).close_outside_band({"p": counted})
        assert (not closed.solo) == band_gate_keeps(ratios, taught, 0.8, 0.2)
    assert not band_gate_keeps([0.1, 0.15], [True, True], 0.8, 0.2) and band_gate_keeps([0.3], [True], 0.8, 0.2)


# 8 completions a prompt: "weak" solves p4 once (failed at `taught_failed_rate: 0.125`, not at 0), "strong" fails p2
RECORDS_8 = _records({
    "weak": {"p1": [0.0] * 8, "p2": [1.0] * 4 + [0.0] * 4, "p4": [1.0] + [0.0] * 7},
    "strong": {"p1": [1.0] * 2 + [0.0] * 6, "p2": [0.0] * 8, "p4": [1.0] * 8},
})  # fmt: skip


def _gated(view: dict, closed: set[str]) -> dict:
    """A learner's view without the peers the band gate closes."""
    return {
        "learns_from": [p for p in view["learns_from"] if p not in closed],
        "taught": {p: v for p, v in view["taught"].items() if p not in closed},
        "rescued": {p: v for p, v in view["rescued"].items() if p not in closed},
    }


@pytest.mark.parametrize("counted", ["a valid row counts", "only an invalid row would count"])
@pytest.mark.parametrize("name", list(SHARING_PRESETS))
def test_for_every_named_mode_the_probe_reports_the_trainers_decision_after_the_band_gate(name, counted):
    """Every `sharing:` name, on one batch: the trainer decides (`decide` with the records), then its band gate
    closes a peer none of whose valid rows counts (`band_counts`); the probe reports the decision made with the band
    gate off and, per peer, `band_gate_keeps` on the same rows. Read together they are the trainer's decision. A
    peer's rows here: ratio 0.9 (in the band, above the floor) and 0.1 (below both), the one at 0.9 valid or not
    (a truncated row gets no loss, so it cannot keep a peer open)."""
    import torch

    from hacpo_trl.algorithm import HACPOLossConfig, stepwise_lower_bound
    from hacpo_trl.sharing.peer_loss import band_counts
    from hacpo_trl.sharing.peer_rows import PeerRows

    values = expand_sharing({"sharing": name, "naive": False, "peer_clipping": True, "capability_metric": "accuracy"})
    sharing = SharingSettings.from_values(values)
    probe_sharing = SharingSettings.from_values({**values, "band_gate": False})  # as `probe_batch` decides
    config = HACPOLossConfig()
    lb = stepwise_lower_bound(0, config.delta, config.delta_step)
    caps, rows, agents = {"weak": 0.2, "strong": 0.6}, {"weak": 24, "strong": 24}, ["weak", "strong"]
    ratios, valid = [0.9, 0.1], ([True, True] if counted == "a valid row counts" else [False, True])
    for learner in agents:
        decision = decide(sharing, learner, agents, caps, rows, 3, 0, RECORDS_8, True)
        peers = list(decision.involved)
        appended = PeerRows(
            sources=[p for p in peers for _ in ratios], valid=valid * len(peers),
            taught=[p in decision.taught for p in peers for _ in ratios],
        )  # fmt: skip
        if sharing.band_gate and peers:
            scored = torch.tensor([r for _ in peers for r, ok in zip(ratios, valid, strict=True) if ok])
            counts = dict(zip(peers, band_counts(scored, appended, peers, config, sharing), strict=True))
            if 0 in counts.values():
                decision = decision.close_outside_band(counts)
        trainer = learner_view(decision)
        view = learner_view(decide(probe_sharing, learner, agents, caps, rows, 3, 0, RECORDS_8, True))
        keeps = {p: band_gate_keeps(ratios, [p in view["taught"]] * 2, lb, 0.2, valid) for p in view["learns_from"]}
        closed = {p for p, kept in keeps.items() if not kept} if sharing.band_gate else set()
        assert _gated(view, closed) == trainer, (name, learner)
    if name == "recommended" and counted == "a valid row counts":  # p4, solved once in 8, is taught too
        assert trainer == {"learns_from": ["weak"], "taught": {"weak": ["p2"]}, "rescued": {}}
        weak = learner_view(decide(sharing, "weak", agents, caps, rows, 3, 0, RECORDS_8, True))
        assert weak["taught"] == {"strong": ["p1", "p4"]}
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import reproduce

        quarter = {**expand_sharing({}), **reproduce.SCREENED_SHARING["quarter_weight"]}
        quarter = SharingSettings.from_values({**quarter, **values, "taught_failed_rate": 0.0})
        assert learner_view(decide(quarter, "weak", agents, caps, rows, 3, 0, RECORDS_8, True))["taught"] == {
            "strong": ["p1"]
        }


def test_combinations_that_do_nothing_or_overlap_are_refused_with_one_line(tmp_path):
    """`taught_ratio_floor` acts on taught rows only, and `capability_gate_rescue` would take, from a closed peer,
    rows of the very prompts `peer_prompts: failed` already takes from every peer. `taught_schedule: solo` without
    `solo_steps_per_generation` is not refused: it is the preset's, taught rows interleaved in the recipe's updates."""
    with pytest.raises(ValueError, match=r"^`taught_ratio_floor: 0.3` acts on taught rows, .* taught_ratio_floor 0.2$"):
        SharingSettings(taught_ratio_floor=0.3)
    both = dict(capability_gate=1.0, capability_gate_rescue=True)
    with pytest.raises(
        ValueError, match=r"^`capability_gate_rescue` lends .* or peer_prompts 'all' to keep the rescue$"
    ):
        SharingSettings(peer_prompts="failed", **both)
    with pytest.raises(ValueError, match=r"`capability_gate_rescue` lends a closed peer's rows"):
        HACPOConfig(output_dir=str(tmp_path), sharing="recommended", **both, **COMMON)
    assert SharingSettings(peer_prompts="better", **both).capability_gate_rescue  # different prompts: kept
    assert SharingSettings(peer_prompts="failed", taught_schedule="solo").solo_steps_per_generation is None


def test_the_peer_rows_read_the_learners_checked_settings_over_its_config():
    from types import SimpleNamespace

    view = SharingSettings(peer_filter="correct").over(SimpleNamespace(peer_filter="all", max_reward=1.0))
    assert (view.peer_filter, view.taught_scale, view.max_reward) == ("correct", 1.0, 1.0)


def test_the_model_card_names_the_mode_and_its_settings(tmp_path):
    from hacpo_trl.training.model_card import hacpo_card_section

    cfg = HACPOConfig(output_dir=str(tmp_path), sharing="recommended", taught_scale=0.5, **COMMON)
    card = hacpo_card_section(cfg, "policy", None, [], 0)
    assert "sharing: recommended (" in card and "taught_scale 0.5 (set)" in card and '"sharing": "recommended"' in card


def test_each_learner_setting_has_one_default():
    """A learner setting's default is SharingSettings' (the paper's, from `hacpo_trl.sharing.presets`); the config's field
    is None where the sharing mode fills it, else the same value."""
    config = {f.name: f.default for f in dataclasses.fields(HACPOConfig)}
    for f in dataclasses.fields(SharingSettings):
        expected = None if f.name in SHARING_PRESETS["paper"] else f.default
        assert config[f.name] == expected, f.name


def _class(path: Path, name: str):
    import ast

    return next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)


def test_each_learner_setting_is_declared_once():
    """`SharingFields` declares every learner setting (name, type, default, help, doc): `HACPOConfig` inherits the
    very fields and `SharingSettings` takes them, so no other class body declares one and its doc is written once."""
    import ast
    import importlib.util

    from transformers import HfArgumentParser

    from hacpo_trl.sharing.decision import LEARNER_SETTINGS

    package = ROOT / "src" / "hacpo_trl"
    config_class, settings_class = (
        _class(package / "config.py", "HACPOConfig"),
        _class(package / "sharing" / "settings.py", "SharingSettings"),
    )
    for node in (config_class, settings_class):
        own = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} & set(LEARNER_SETTINGS)
        assert not own, f"{node.name} declares {sorted(own)} again"
    from hacpo_trl.sharing.decision import SharingFields  # the one declaration

    declared = {f.name: f for f in dataclasses.fields(SharingFields)}
    assert tuple(declared) == LEARNER_SETTINGS == tuple(f.name for f in dataclasses.fields(SharingSettings))
    config = {f.name: f for f in dataclasses.fields(HACPOConfig)}
    assert all(config[name] is declared[name] and declared[name].metadata["help"] for name in declared)
    for f in dataclasses.fields(SharingSettings):
        assert f.default == SHARING_PRESETS["paper"].get(f.name, declared[f.name].default), f.name
        assert dict(f.metadata) == dict(declared[f.name].metadata), f.name
    parser = HfArgumentParser(HACPOConfig)  # the command line sees the fields, with their help
    assert all(parser._option_string_actions[f"--{n}"].help == f.metadata["help"] for n, f in declared.items())
    flags = parser.parse_args(["--output_dir", "x", "--peer_filter", "correct", "--band_gate", "true"])
    assert (flags.peer_filter, flags.band_gate, flags.taught_scale) == ("correct", True, None)
    spec = importlib.util.spec_from_file_location("make_options", ROOT / "docs" / "make_options.py")
    make_options = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_options)

    def documented(node) -> list[str]:
        return [
            n
            for _, entries in make_options.config_entries(ast.get_docstring(node))
            for names, _, _ in entries
            for n in names
        ]

    assert sorted(documented(_class(package / "sharing" / "settings.py", "SharingFields"))) == sorted(LEARNER_SETTINGS)
    assert not set(documented(config_class)) & set(LEARNER_SETTINGS)


def test_every_recipe_names_its_mode_and_a_run_says_it_first():
    """A copied recipe never trains with a mode its user did not see: each shipped recipe has a `sharing:` line,
    and a run's first line about sharing names the mode, what it means, and when the recipe left it to the default."""
    from hacpo_trl.launch.start import sharing_line

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        assert yaml.safe_load(path.read_text()).get("sharing") in SHARING_PRESETS, path.name
    line = sharing_line({"sharing": "recommended", "taught_cap": 2}, named=True)
    assert line.startswith("hacpo: sharing: recommended (a peer's correct rows") and "taught_cap 2 (set)" in line
    assert "not named" not in line
    line = sharing_line({}, named=False)
    assert (
        line.startswith("hacpo: sharing: paper (the paper's rule") and "[not named in the recipe: the default" in line
    )
