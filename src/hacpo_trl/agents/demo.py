"""The built-in tiny agents of the CPU demo and benchmarks, built reproducibly from a seed and cached at first use.

Short-answer task (``arithmetic``), kept for tests and comparison:

* ``builtin:tiny-llama``: Llama, character tokenizer, ``[INST]`` chat template, ~124k parameters; the stronger agent.
* ``builtin:tiny-qwen2``: Qwen2, byte-level BPE, ChatML template, ~73k parameters; the weaker agent.

Reasoning-trace task (``arithmetic_trace``), one pair per kind of heterogeneity in the paper (see ``PAIRS``):

* *state* (same architecture and tokenizer, different amounts of warm-start, like Qwen3-4B vs -4B-Instruct):
  ``trace-base`` and ``trace-instruct``, the same model warm-started to a lower band, then on to a higher one;
* *size* (same tokenizer, different depth and width, like Qwen3-1.7B vs 4B): ``trace-small`` and ``trace-large``;
* *model* (different architecture and tokenizer, like Qwen3 vs Llama-3.2): ``trace-llama`` (character tokenizer)
  and ``trace-qwen2`` (byte-level BPE);
* *style* (one architecture, tokenizer and size, traces written differently, like a Base and an Instruct model):
  ``trace-llama`` and ``trace-bracket``, warm-started on the ``steps`` and the ``bracket`` format of the same
  worked solutions (``trace-bracket`` in the stronger band, like the Instruct model); each finds the other's traces
  unlikely, which the paper's importance weights and band exist for.

Not one of the paper's kinds, the *complement* pair (``PAIRS["complement"]``): ``trace-carry`` and ``trace-nocarry``,
one shape and tokenizer, each warm-started mostly on one half of ``arithmetic_trace_carries`` (additions where every
column carries, or none does) to the same band of overall greedy accuracy, so that neither is stronger overall and
each is clearly better on its own half (`HalfAgent`; the build records its accuracy per half and fails without a lead).

The *vllm* pair (``PAIRS["vllm"]``), on ``arithmetic``: ``vllm-llama`` (character tokenizer, the stronger) and
``vllm-qwen2`` (byte-level BPE), shaped for vLLM's CPU attention (head_dim 32, untied embeddings; `VllmAgent`), so
that the vLLM path runs on CPU with agents that score from the start and learn the task (with the recommended preset
within 8 generation batches: benchmarks/RESULTS.md).

Every agent is warm-started with a short supervised run on its task's ``warmup`` split (never the RL ``train`` or
the held-out ``test`` split), until its accuracy on validation problems lies in a stated band (``BUILTIN_AGENTS``),
so that each solves part of the task, RL has something to improve, and every machine builds agents of the same
strength; ``hacpo_build.json`` in the agent's folder records the steps and accuracy. The warm-start
uses exactly the tokenizer that ``AutoTokenizer.from_pretrained(folder)`` returns for the saved agent: the trainer
and ``hacpo-eval`` load it that way, and under transformers 5 a Qwen2 folder loads as ``Qwen2Tokenizer``, which
splits digits differently from the in-memory tokenizer it was built from.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ..tasks.data import task_splits
from .cache import build_lock, cache_folder
from .tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2

__all__ = ["BUILTIN_AGENTS", "PAIRS", "DemoAgent", "HalfAgent", "VllmAgent", "build_agent", "build_record", "untrained"]


@dataclass(frozen=True)
class DemoAgent:
    architecture: str  # "llama" | "qwen2"
    hidden_size: int
    layers: int
    band: tuple[float, float]  # validation accuracy (see ``measure``) the warm-start stops in, both ends included
    seed: int
    max_steps: int = 3000  # the cap: a build that ends here outside its band fails
    learning_rate: float = 3e-3
    batch_size: int = 64
    task: str = "arithmetic"  # whose warmup split it is warm-started on
    after: str | None = None  # continue this agent's warm-start (same model, same stream) toward ``band``
    measure: str = "greedy"  # "greedy" or "sampled" (SAMPLES per problem at temperature 1) accuracy for ``band``


@dataclass(frozen=True)
class HalfAgent(DemoAgent):
    """An agent of a task with halves (`hacpo_trl.tasks.data.HALVES`), warm-started mostly on one of them, so that it is
    better there than on the other (the ``complement`` pair). A subclass, not new `DemoAgent` fields, so that the
    other agents' cache folders (named after their spec) stay as they are."""

    half: str = ""  # the half it is warm-started mostly on, and must lead on
    own_share: float = 0.9  # of its warm-up rows from its own half (the rest from the other half)
    lead: float = 0.15  # the least (own half - other half) greedy validation accuracy at build, else the build fails
    validation_size: int = 1000  # validation problems scored at each check (half of each half)


@dataclass(frozen=True)
class VllmAgent(DemoAgent):
    """An agent shaped for vLLM's CPU attention, which supports head sizes 32 to 512 only (the other agents' 4 heads
    give 8 to 24): fewer heads. A subclass, as `HalfAgent`, so that the other agents' cache folders stay as they are."""

    heads: int = 2
    kv_heads: int = 1


# Every agent is warm-started TOWARD A BAND of validation accuracy, not for a fixed number of steps: the same steps
# land on different agents on different CPUs, thread counts or library builds (0.110 vs 0.187 held-out for
# tiny-qwen2 on two machines), while "the first check inside the band" gives an agent of the same strength anywhere.
# The bands: the stronger agent of each pair around 0.45-0.55, the weaker around 0.2-0.3, so that each pair keeps a
# clear gap and the stronger one has room to improve under RL (built at 0.748, the stronger state agent only lost
# accuracy under GSPO). Checks every CHECK_EVERY steps are small next to a band's width (see hacpo_build.json).
CHECK_EVERY = 10
VALIDATION_SIZE = 200  # problems of the validation split scored (greedy, batched) at each check
STRONG, WEAK = (0.45, 0.55), (0.2, 0.3)
# The trace agents' bands are on SAMPLED accuracy, what RL trains on and what the capability P̂ measures: during the
# warm-start's climb sampled accuracy is only 0.1-0.25 x greedy and varies with the build, and a weaker agent built to
# greedy 0.2-0.3 sampled a correct trace 1.5-14% of the time depending on the machine, so GSPO alone lifted it on one
# machine and lowered it on another (benchmarks/RESULTS.md, warm-start rule 3). Greedy accuracy is recorded beside it.
SAMPLES = 4  # per validation problem, at temperature 1, seeded with the agent's seed
STRONG_SAMPLED, WEAK_SAMPLED = (0.2, 0.3), (0.08, 0.14)
_TRACE = {"task": "arithmetic_trace", "measure": "sampled"}
# The complement pair's band is on overall GREEDY accuracy, what the benchmark reports, narrow, and checked on 1000
# validation problems: the pair is meant to be of one overall strength (held-out greedy within 0.05), each agent
# ahead on its own half. Their warm-up climbs through this band (own half from ~0.2 to ~0.9 in some 50 steps, the
# other half near 0), so learning rate 1e-3 (smoother than 3e-3); sampled accuracy is recorded beside it.
COMPLEMENT = (0.40, 0.43)
_HALVES = {"task": "arithmetic_trace_carries", "measure": "greedy", "learning_rate": 1e-3}
BUILTIN_AGENTS = {
    "tiny-llama": DemoAgent("llama", hidden_size=64, layers=3, band=STRONG, seed=1),
    "tiny-qwen2": DemoAgent("qwen2", hidden_size=48, layers=2, band=WEAK, seed=2),
    # state: one model, warm-started less / more (`trace-instruct` is `trace-base` trained further on the same
    # stream, with the same optimizer, from where `trace-base` stopped)
    "trace-base": DemoAgent("llama", hidden_size=64, layers=3, band=WEAK_SAMPLED, seed=11, **_TRACE),
    "trace-instruct": DemoAgent(
        "llama", hidden_size=64, layers=3, band=STRONG_SAMPLED, seed=11, after="trace-base", **_TRACE
    ),
    # size: one tokenizer, a smaller and a larger model (the larger one warm-started further, as 4B is ahead of 1.7B)
    "trace-small": DemoAgent("llama", hidden_size=32, layers=2, band=WEAK_SAMPLED, seed=12, **_TRACE),
    "trace-large": DemoAgent("llama", hidden_size=96, layers=4, band=STRONG_SAMPLED, seed=13, **_TRACE),
    # model: different architecture, tokenizer and chat template (the Qwen2 one the stronger, as it was at fixed steps)
    "trace-llama": DemoAgent("llama", hidden_size=64, layers=3, band=WEAK_SAMPLED, seed=14, **_TRACE),
    "trace-qwen2": DemoAgent("qwen2", hidden_size=64, layers=3, band=STRONG_SAMPLED, seed=15, **_TRACE),
    # style: trace-llama's architecture and size, warm-started on the `bracket` format to the stronger band (the
    # Instruct-like agent of the pair; trace-llama, the weaker, writes the `steps` format)
    "trace-bracket": DemoAgent(
        "llama",
        hidden_size=64,
        layers=3,
        band=STRONG_SAMPLED,
        seed=16,
        task="arithmetic_trace_bracket",
        measure="sampled",
    ),
    # complement: one shape and tokenizer, each warm-started mostly (90%) on one half of arithmetic_trace_carries
    # (every column carries / none does) to the same band of overall greedy accuracy, so that each is clearly better
    # on its own half (COMPLEMENT below)
    "trace-carry": HalfAgent("llama", hidden_size=64, layers=3, band=COMPLEMENT, seed=17, half="carry", **_HALVES),
    "trace-nocarry": HalfAgent("llama", hidden_size=64, layers=3, band=COMPLEMENT, seed=18, half="no_carry", **_HALVES),
    # vllm: the model pair's architectures and tokenizers with head_dim 32, on the short-answer task (cheap to build)
    "vllm-llama": VllmAgent("llama", hidden_size=64, layers=3, band=STRONG, seed=21),
    "vllm-qwen2": VllmAgent("qwen2", hidden_size=64, layers=2, band=WEAK, seed=22),
}

# the paper's three kinds of heterogeneity, and the Base-vs-Instruct difference in how traces are written (style), each a
# pair of built-in agents on `arithmetic_trace`; and complement, on `arithmetic_trace_carries`
PAIRS = {
    "state": ("trace-instruct", "trace-base"),
    "size": ("trace-large", "trace-small"),
    "model": ("trace-llama", "trace-qwen2"),
    "style": ("trace-llama", "trace-bracket"),
    # not one of the paper's kinds: two agents of one overall strength, each better on a different half of the task
    "complement": ("trace-carry", "trace-nocarry"),
    # not one of the paper's kinds either: the pair the vLLM path is tested with on CPU
    "vllm": ("vllm-llama", "vllm-qwen2"),
}
BUILD_RECORD = "hacpo_build.json"  # in each agent's folder: the steps and validation accuracy it was built to
CACHE_VERSION = 4  # v4: trace agents to a sampled band; v3: to a band of validation accuracy (v2: fixed steps)


def _encode(tok, example) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids + EOS): the target is the worked solution when the task has one, else the answer."""
    prompt = tok.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
    target = example.get("solution") or example["answer"]
    answer = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return list(prompt["input_ids"]), answer


def validation_rows(task: str, size: int = VALIDATION_SIZE):
    """The problems a warm-start is checked on: the task's ``validation`` split, or for ``arithmetic`` (which has
    none) the first rows of its RL ``train`` split; never the warm-up data it learns from nor the held-out ``test``."""
    splits = task_splits(task)
    data = splits["validation"] if "validation" in splits else splits["train"]
    return data.select(range(min(size, len(data))))


def warmup_rows(spec: DemoAgent):
    """The warm-up rows an agent learns from: its task's ``warmup`` split, or for a `HalfAgent` its own half's rows
    and, after them, the first of the other half's so that ``own_share`` of the rows are its own half's."""
    rows = task_splits(spec.task)["warmup"]
    if not isinstance(spec, HalfAgent):
        return list(rows)
    own = [r for r in rows if r["half"] == spec.half]
    other = [r for r in rows if r["half"] != spec.half]
    if not own:
        raise ValueError(f"{spec.task!r} has no warm-up rows of half {spec.half!r}")
    return own + other[: round(len(own) * (1 - spec.own_share) / spec.own_share)]


class _WarmStart:
    """Supervised steps on prompt -> target + EOS of the warm-up split (loss on the target only), one stream of
    batches from the agent's seed, and greedy accuracy on the validation rows."""

    def __init__(self, model, tok, spec: DemoAgent):
        from ..tasks.rewards import REWARD_FUNCS

        self.model, self.tok, self.spec = model, tok, spec
        self.rows = [_encode(tok, ex) for ex in warmup_rows(spec)]
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
        self.validation = validation_rows(spec.task, getattr(spec, "validation_size", VALIDATION_SIZE))
        trace = spec.task.startswith("arithmetic_trace")  # either worked-solution format
        self.reward = REWARD_FUNCS["arithmetic_trace" if trace else "arithmetic_exact"]
        self.max_new_tokens = 40 if trace else 6  # as the demo recipes generate
        self.steps = 0

    def train(self, steps: int) -> None:
        spec, tok, model = self.spec, self.tok, self.model
        model.train()
        for _ in range(steps):
            picks = torch.randint(len(self.rows), (spec.batch_size,), generator=self.generator).tolist()
            length = max(len(self.rows[i][0]) + len(self.rows[i][1]) for i in picks)
            ids = torch.full((spec.batch_size, length), tok.pad_token_id)
            labels = torch.full((spec.batch_size, length), -100)
            attention = torch.zeros(spec.batch_size, length, dtype=torch.long)
            for j, i in enumerate(picks):
                prompt, answer = self.rows[i]
                seq = prompt + answer
                ids[j, : len(seq)] = torch.tensor(seq)
                attention[j, : len(seq)] = 1
                labels[j, len(prompt) : len(seq)] = torch.tensor(answer)
            model(input_ids=ids, attention_mask=attention, labels=labels).loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.steps += 1

    def snapshot(self) -> dict:
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(),
                "steps": self.steps,
            }
        )

    def restore(self, saved: dict) -> None:
        saved = copy.deepcopy(saved)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.generator.set_state(saved["generator"])
        self.steps = saved["steps"]

    def accuracy(self, measure: str = "greedy") -> float:
        """Greedy accuracy on the validation rows, or with ``"sampled"`` the mean over SAMPLES samples per problem at
        temperature 1 (the RNG seeded with the agent's seed, and left as it was for the warm-start's own stream)."""
        return self.evaluate(measure).avg_at_k

    def evaluate(self, measure: str = "greedy", by: str | None = None):
        """`accuracy`'s `EvalResult`; with ``by="half"`` also per half of a task with halves (same completions)."""
        from ..evaluation.evaluate import evaluate_model

        sampled = {"k": SAMPLES, "temperature": 1.0} if measure == "sampled" else {}
        with torch.random.fork_rng():
            torch.manual_seed(self.spec.seed)
            return evaluate_model(
                self.model, self.tok, self.validation, self.reward, max_new_tokens=self.max_new_tokens,
                batch_size=100, by=by, **sampled,
            )  # fmt: skip


def _stages(name: str) -> list[tuple[str, DemoAgent]]:
    """The warm-starts an agent is built through: its ``after`` agent's (recursively), then its own."""
    spec = BUILTIN_AGENTS[name]
    return (_stages(spec.after) if spec.after else []) + [(name, spec)]


PROGRESS_SECONDS = 30.0  # a build's progress line at most this often (a build takes minutes: never silent)


class BuildProgress:
    """Prints where a build stands (steps, accuracy against the band, time so far) at most every ``every``
    seconds of ``clock``, so that a build of several minutes is never silent."""

    def __init__(self, name: str, spec: DemoAgent, every: float = PROGRESS_SECONDS, clock=time.monotonic, out=None):
        self.name, self.spec, self.every, self.clock, self.out = name, spec, every, clock, out
        self.start = self.last = clock()

    def update(self, steps: int, accuracy: float) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        low, high = self.spec.band
        print(
            f"hacpo: building {self.name!r}: step {steps} (cap {self.spec.max_steps}), {self.spec.measure} accuracy "
            f"{accuracy:.3f}, band [{low}, {high}], {_minutes(now - self.start)} so far",
            file=self.out or sys.stderr,
            flush=True,
        )


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _warm_start(model, tok, stages: list[tuple[str, DemoAgent]]) -> list[dict]:
    """Warm-start through each stage until validation accuracy, checked every ``CHECK_EVERY`` steps, first lies in
    the stage's band; returns one record per stage.

    A check that lands above the band goes back to the previous check (model, optimizer and batch stream restored
    exactly) and proceeds one step at a time. A stage that still passes its band in one step, or reaches its step cap,
    raises: an agent outside its band would silently change every demo and benchmark built on it."""
    run = _WarmStart(model, tok, stages[0][1])
    records = []
    for name, spec in stages:
        low, high = spec.band
        print(
            f"hacpo: building {name!r}: warm-start until {spec.measure} accuracy is in [{low}, {high}] (a few minutes; "
            f"built once, then cached)",
            file=sys.stderr,
            flush=True,
        )
        progress = BuildProgress(name, spec)
        stride, accuracy, refined = CHECK_EVERY, run.accuracy(spec.measure), False
        saved, previous = None, accuracy
        while not low <= accuracy <= high:
            if accuracy > high and stride > 1 and saved is not None:
                run.restore(saved)
                stride, accuracy, refined = 1, previous, True
                continue
            if accuracy > high or run.steps >= spec.max_steps:
                why = "passed it in one step" if accuracy > high else f"reached the cap of {spec.max_steps} steps"
                raise RuntimeError(
                    f"built-in agent {name!r}: the warm-start {why} with validation accuracy {accuracy:.3f} outside "
                    f"its band [{low}, {high}] after {run.steps} steps; please report this with your CPU and torch "
                    "version"
                )
            saved, previous = run.snapshot(), accuracy
            run.train(min(stride, spec.max_steps - run.steps))
            accuracy = run.accuracy(spec.measure)
            progress.update(run.steps, accuracy)
        print(f"hacpo: built {name!r} in {run.steps} steps: {spec.measure} accuracy {accuracy:.3f}", file=sys.stderr)
        record = {"agent": name, "steps": run.steps, "validation_accuracy": round(accuracy, 4), "band": [low, high]}
        record |= {"measure": spec.measure, "refined": refined}
        if spec.measure != "greedy":
            record["greedy_accuracy"] = round(run.accuracy(), 4)
        if isinstance(spec, HalfAgent):
            record |= _half_record(name, spec, run)
        records.append(record)
    return records


def _half_record(name: str, spec: HalfAgent, run) -> dict:
    """A `HalfAgent`'s accuracy per half at build (greedy and sampled, on the same validation rows), and its overall
    sampled accuracy (its band is on greedy); fails the build if it does not lead on its own half by ``spec.lead``:
    the pair it belongs to would not be what it claims."""
    greedy, sampled = run.evaluate("greedy", by="half").by_group, run.evaluate("sampled", by="half")
    lead = greedy[spec.half] - max(v for h, v in greedy.items() if h != spec.half)
    if lead < spec.lead:
        raise RuntimeError(
            f"built-in agent {name!r}: greedy validation accuracy per half {greedy} leads on its own half "
            f"{spec.half!r} by {lead:.3f}, less than the {spec.lead} it is built for; please report this with your "
            "CPU and torch version"
        )
    return {
        "half": spec.half,
        "greedy_accuracy_by_half": {h: round(v, 4) for h, v in greedy.items()},
        "sampled_accuracy": round(sampled.avg_at_k, 4),
        "sampled_accuracy_by_half": {h: round(v, 4) for h, v in sampled.by_group.items()},
    }


def _as_loaded(model, tok, folder: str):
    """The tokenizer exactly as `AutoTokenizer.from_pretrained` will load it from the agent's saved folder (the
    model's config decides its class), checked to keep the vocabulary the model was sized for."""
    from transformers import AutoTokenizer

    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if len(loaded) != len(tok) or loaded.eos_token_id != tok.eos_token_id or loaded.pad_token_id != tok.pad_token_id:
        raise RuntimeError(f"the saved tokenizer in {folder} does not load back with the same vocabulary and specials")
    return loaded


def _remove_stale_builds(folder: str) -> None:
    """Remove ``<folder>.tmp-PID-...`` left by builds that were killed (their process is gone)."""
    import glob

    for tmp in glob.glob(glob.escape(folder) + ".tmp-*-*"):
        pid = tmp.rsplit(".tmp-", 1)[1].split("-")[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, OSError):
            pass  # not ours to judge: a malformed name or another user's live process


def build_record(folder: str) -> dict | None:
    """What a built-in agent's folder was built to (its ``hacpo_build.json``), or None for any other folder."""
    path = os.path.join(folder, BUILD_RECORD)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def build_agent(name: str, directory: str | None = None) -> str:
    """Build (or reuse from the cache) a built-in agent; returns the folder with its model and tokenizer."""
    if name not in BUILTIN_AGENTS:
        raise ValueError(f"unknown built-in agent {name!r}; available: {sorted(BUILTIN_AGENTS)}")
    spec = BUILTIN_AGENTS[name]
    # an agent that continues another's warm-start is rebuilt when that one's spec changes
    version = f"{CACHE_VERSION}:{json.dumps([asdict(s) for _, s in _stages(name)[:-1]], sort_keys=True)}"
    folder = cache_folder(name, spec, version if spec.after else CACHE_VERSION, directory)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    with build_lock(folder):
        if not os.path.isfile(os.path.join(folder, "config.json")):  # not built by the process we waited for
            _build(name, spec, folder)
    return folder


def untrained(spec: DemoAgent):
    """``(model, tokenizer)``: the agent's architecture and tokenizer before its warm-start."""
    tok = char_tokenizer() if spec.architecture == "llama" else bpe_tokenizer()
    build = tiny_llama if spec.architecture == "llama" else tiny_qwen2
    heads = {"heads": spec.heads, "kv_heads": spec.kv_heads} if isinstance(spec, VllmAgent) else {}
    return build(tok, hidden_size=spec.hidden_size, layers=spec.layers, seed=spec.seed, **heads), tok


def _build(name: str, spec: DemoAgent, folder: str) -> None:
    _remove_stale_builds(folder)
    torch.manual_seed(spec.seed)
    model, built = untrained(spec)
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    tok = _as_loaded(model, built, tmp)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fewer sources of difference between machines; the band is the guarantee
    try:
        stages = _warm_start(model, tok, _stages(name))
    finally:
        torch.set_num_threads(threads)
    record = {**stages[-1], "stages": stages, "check_every": CHECK_EVERY}
    record["validation_size"] = getattr(spec, "validation_size", VALIDATION_SIZE)
    with open(os.path.join(tmp, BUILD_RECORD), "w") as f:
        json.dump(record, f, indent=1)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    if os.path.isdir(folder):  # a folder without its config.json: not a build of ours, never complete
        shutil.rmtree(folder)
    os.replace(tmp, folder)  # atomic: an interrupted build never leaves a half-written agent
