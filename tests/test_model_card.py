"""`hacpo_trl.training.model_card`: the HACPO section of an agent's card from settings, peers and log history."""

import json

from hacpo_trl.agents.pretrained import PROVENANCE_FILE
from hacpo_trl.config import AgentSpec, HACPOConfig
from hacpo_trl.training.model_card import CARD_SETTINGS, append_card_section, hacpo_card_section, hub_base_model


def _settings(share_rollouts=True):
    class Settings:
        pass

    s = Settings()
    for key in CARD_SETTINGS:
        setattr(s, key, f"<{key}>")
    s.alpha = 1.0
    s.specs = [AgentSpec(name="small", model_name_or_path="org/small"), AgentSpec(name="big")]
    s.share_rollouts = share_rollouts
    s.use_vllm, s.vllm_importance_sampling_correction = True, False
    return s


def test_card_names_agent_peers_recipe_and_final_metrics():
    history = [
        {"reward": 0.25, "hacpo/capability/small": 0.2, "loss": 1.0},
        {"reward": 0.5, "hacpo/capability/small": 0.4, "hacpo/capability/big": 0.6},
        {"train_loss": 0.125, "note": "text"},
    ]
    card = hacpo_card_section(_settings(), "small", "org/small", history, 7)
    assert card.startswith("\n\n## HACPO\n\nThis model is agent `small` of a HACPO run")
    assert "Base model: `org/small`." in card and "offline copy" not in card
    assert "from those of its peers:\n- `big`: `in-memory model`\n" in card and "- `small`" not in card
    recipe = json.loads(card.split("```json\n")[1].split("```")[0])
    assert list(recipe) == list(CARD_SETTINGS) and recipe["alpha"] == 1.0
    # the last value of each reward / capability / train_loss entry; other keys left out
    table = card.split("Final training metrics:")[1]
    assert "| reward | 0.5 |" in table and "| hacpo/capability/small | 0.4 |" in table
    assert "| hacpo/capability/big | 0.6 |" in table and "| train_loss | 0.125 |" in table
    assert "| loss |" not in table and "note" not in table and "| global step | 7 |" in table


def test_card_without_sharing_or_history(tmp_path):
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({"hub_id": "Org/Real-Model"}))
    card = hacpo_card_section(_settings(share_rollouts=False), "small", str(tmp_path), [], 0)
    assert "trained on its own completions only (no rollout sharing)" in card and "peers:" not in card
    assert "It is an offline copy of `Org/Real-Model`" in card
    assert "Final training metrics" not in card
    assert "Base model: `in-memory model`." in hacpo_card_section(_settings(), "big", None, [], 0)


def test_card_settings_are_config_fields():
    fields = HACPOConfig.__dataclass_fields__
    assert [k for k in CARD_SETTINGS if k not in fields] == []


def test_hub_base_model_names_the_hub_model_only_while_trl_writes_the_card(tmp_path):
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({"hub_id": "Org/Real-Model"}))

    class Model:
        class config:  # noqa: N801
            _name_or_path = "/local/copy"

    with hub_base_model(Model(), str(tmp_path)):
        assert Model.config._name_or_path == "Org/Real-Model"
    assert Model.config._name_or_path == "/local/copy"
    with hub_base_model(Model(), "/not/a/builtin"):
        assert Model.config._name_or_path == "/local/copy"


def test_append_card_section_needs_trls_card(tmp_path):
    append_card_section(str(tmp_path), "lost")
    assert not (tmp_path / "README.md").exists()
    (tmp_path / "README.md").write_text("---\nbase_model: x\n---\n")
    append_card_section(str(tmp_path), "\n## HACPO\n")
    assert (tmp_path / "README.md").read_text() == "---\nbase_model: x\n---\n\n## HACPO\n"


def test_card_records_whether_trls_vllm_is_correction_was_applied():
    """Review N3: the recipes turn TRL's vLLM importance-sampling correction off for the paper's loss; the card
    says which loss the agent was trained with."""
    s = _settings()
    card = hacpo_card_section(s, "small", "org/small", [], 0)
    assert "TRL's vLLM importance-sampling correction was OFF, as in the paper's loss." in card
    recipe = json.loads(card.split("```json\n")[1].split("```")[0])
    assert recipe["vllm_importance_sampling_correction"] is False
    s.vllm_importance_sampling_correction, s.vllm_importance_sampling_mode = True, "sequence_mask"
    assert "correction was ON (mode `sequence_mask`)" in hacpo_card_section(s, "small", None, [], 0)
    s.use_vllm = False
    assert "no vLLM importance-sampling correction applies" in hacpo_card_section(s, "small", None, [], 0)


def test_name_card_leaves_no_none_in_trls_card():
    from hacpo_trl.training.model_card import name_card

    trl_card = (
        "# Model Card for None\n\nThis model is a fine-tuned version of [None](https://huggingface.co/None).\n"
        'generator = pipeline("text-generation", model="None", device_map="auto")\n'
    )
    card = name_card(trl_card, "trace-small", "builtin:trace-small", "outputs/demo/trace-small")
    assert "None" not in card
    assert card.startswith("# Model Card for trace-small\n")
    assert "fine-tuned version of `builtin:trace-small`." in card and 'model="outputs/demo/trace-small"' in card
    hub = name_card(trl_card, "a", "Qwen/Qwen3-1.7B", "me/a")
    assert "[Qwen/Qwen3-1.7B](https://huggingface.co/Qwen/Qwen3-1.7B)" in hub and 'model="me/a"' in hub


def test_a_cache_folder_is_named_as_the_builtin_the_user_wrote(tmp_path, monkeypatch):
    from hacpo_trl.agents.cache import builtin_name

    monkeypatch.setenv("HACPO_CACHE", str(tmp_path))
    assert builtin_name(str(tmp_path / "trace-small-05d8365ca4")) == "builtin:trace-small"
    assert builtin_name(str(tmp_path / "smollm2-135m-instruct-89bf2d7341")) == "builtin:smollm2-135m-instruct"
    assert builtin_name(str(tmp_path / "elsewhere" / "trace-small-05d8365ca4")) is None
    assert builtin_name("outputs/my-model") is None and builtin_name(None) is None


def test_complete_card_names_the_base_as_written_and_appends_the_section(tmp_path, monkeypatch):
    """TRL's card of a local model: the agent, the base (the recipe's name, else `builtin:<name>` for a cache folder)
    and the saved folder fill its `None`s; the HACPO section follows. Without TRL's card nothing is written."""
    from hacpo_trl.training.model_card import complete_card

    monkeypatch.setenv("HACPO_CACHE", str(tmp_path / "cache"))
    trl_card = "# Model Card for None\n\nA fine-tuned version of [None](https://huggingface.co/None).\n"
    s = _settings()
    s.output_dir = str(tmp_path / "out")
    for written, expected in ((None, "`builtin:trace-small`"), ("./models/small", "`./models/small`")):
        s.agent_spec = AgentSpec(name="small", model_name_or_path=written)
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / "README.md").write_text(trl_card)
        complete_card(s, "small", str(tmp_path / "cache" / "trace-small-05d8365ca4"), [], 3, "me/small")
        text = (tmp_path / "out" / "README.md").read_text()
        head, section = text.split("\n\n## HACPO\n\n")
        assert head == f"# Model Card for small\n\nA fine-tuned version of {expected}.\n"
        assert f"Base model: {expected}." in section and "None" not in text
    (tmp_path / "out" / "README.md").unlink()
    complete_card(s, "small", None, [], 3, "me/small")
    assert not (tmp_path / "out" / "README.md").exists()
