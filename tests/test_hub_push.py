"""`push_to_hub`: every agent goes to its own repository, with a HACPO model card, and loads from there.

The Hub cannot be reached from CI, so the push goes to a local stand-in endpoint (tests/hub_stand_in.py) that
stores what the real client uploads.
"""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from hub_stand_in import HubStandIn

pytestmark = pytest.mark.launch


def test_each_agent_is_pushed_to_its_own_repo_and_loads(tmp_path, launch, monkeypatch):
    hub_root = tmp_path / "hub"
    with HubStandIn(hub_root) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        launch(2, "train_agents.py", "--out", str(tmp_path / "run"), "--steps", "2", "--push")
    assert ("POST", "/api/repos/create") in hub.requests
    for agent, peer, architecture in (("llama0", "qwen1", "LlamaForCausalLM"), ("qwen1", "llama0", "Qwen2ForCausalLM")):
        repo = hub_root / "tester" / agent
        model = AutoModelForCausalLM.from_pretrained(repo)
        tok = AutoTokenizer.from_pretrained(repo)
        assert type(model).__name__ == architecture and tok.chat_template
        card = (repo / "README.md").read_text()
        assert "## HACPO" in card and f"agent `{agent}`" in card
        assert f"`{peer}`" in card  # the peer it trained with
        assert '"alpha": 1.0' in card and "hacpo/capability/" in card  # recipe and final metrics
