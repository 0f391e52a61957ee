"""Evaluate each agent on its own, as the standalone model it is at inference: its own tokenizer and chat template
(with the ``chat_template_kwargs`` it was trained with, from the record `hacpo-train` writes next to it).

Greedy decoding gives avg@1; with ``k > 1`` samples per problem (``temperature > 0``) it reports avg@k (mean
accuracy over the samples) and best@k (a problem counts if any sample is right), the paper's two protocols. On a GPU
the transformers backend generates only as many sequences at once as their KV cache fits in the free memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

__all__ = [
    "EvalResult",
    "builtin_eval",
    "eval_length",
    "eval_placement",
    "evaluate_model",
    "least_free_bytes",
    "evaluate_with_vllm",
    "kv_cache_bytes",
    "load_for_eval",
    "reward_arguments",
    "sequences_per_batch",
    "trained_task",
]

MAIN_TABLE_NEW_TOKENS = 8192  # the paper's generation budget for its main table (4096 for the ablations)
GENERATION_MEMORY_FRACTION = 0.9  # of the free device memory: the rest for generate's own buffers and fragmentation


@dataclass
class EvalResult:
    avg_at_k: float
    best_at_k: float
    k: int
    n: int
    by_group: dict[str, float] | None = None  # avg@k per value of the column named by `evaluate_model(by=...)`

    def as_dict(self) -> dict:
        out = {"avg@k": self.avg_at_k, "best@k": self.best_at_k, "k": self.k, "n": self.n}
        return out if self.by_group is None else {**out, "avg@k_by_group": self.by_group}


def _check_sampling(k: int, temperature: float) -> None:
    if k < 1:
        raise ValueError(f"`k` must be >= 1, got {k}")
    if k > 1 and temperature <= 0:
        raise ValueError("avg@k / best@k with k > 1 need sampling: set `temperature` > 0")


def _prompt_ids(tokenizer, row: dict, chat_template_kwargs: dict | None) -> list[int]:
    """The agent's own view of a prompt: its chat template for conversations, plain tokens for strings."""
    if isinstance(row["prompt"], list):
        return list(
            tokenizer.apply_chat_template(
                row["prompt"],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **(chat_template_kwargs or {}),
            )["input_ids"]
        )
    return list(tokenizer(row["prompt"])["input_ids"])


def _ignore(*args, **kwargs) -> None:
    """`log_extra` / `log_metric` of an evaluation: TRL's trainer logs them; held-out evaluation has no table."""


_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL passes every other column to the rewards


def reward_arguments(rows: list[dict], completions: list, completion_ids: list[list[int]], k: int, trainer_state=None):
    """What a reward function receives, as in training (TRL's `GRPOTrainer._calculate_rewards`): ``prompts``,
    ``completions`` (TRL's format: message lists for a conversational dataset, strings for a plain one),
    ``completion_ids``, every other dataset column as a list aligned with the completions (``k`` per row, row by
    row), ``trainer_state`` (None outside training) and the ``log_extra`` / ``log_metric`` writers (no-ops here)."""
    columns = {key: [r[key] for r in rows for _ in range(k)] for key in rows[0] if key not in _NOT_COLUMNS}
    return {
        "prompts": [r["prompt"] for r in rows for _ in range(k)],
        "completions": completions,
        "completion_ids": completion_ids,
        **columns,
        "trainer_state": trainer_state,
        "log_extra": _ignore,
        "log_metric": _ignore,
    }


def trl_completions(tokenizer, rows: list[dict], prompt_ids: list[list[int]], completion_ids: list[list[int]], k: int):
    """Completions as TRL's `GRPOTrainer._generate` hands them to the rewards: for a conversational prompt
    ``[{"role": "assistant", "content": text}]`` (parsed by the tokenizer's response template where it has one),
    else the text; completions row by row, ``k`` per row, ``completion_ids`` up to and with the first EOS."""
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if not rows or not isinstance(rows[0]["prompt"], list):
        return texts
    template = getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)
    if template is not None:
        from trl.chat_template_utils import parse_response

        prefixes = [prompt_ids[i] for i in range(len(rows)) for _ in range(k)]
        return [[parse_response(tokenizer, ids, prefix=p)] for ids, p in zip(completion_ids, prefixes, strict=True)]
    return [[{"role": "assistant", "content": text}] for text in texts]


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    """A generated row up to and with its first EOS (the padding after it dropped), as TRL keeps it."""
    return ids[: ids.index(eos) + 1] if eos is not None and eos in ids else ids


def _score(
    reward_func: Callable,
    rows: list[dict],
    completions: list,
    completion_ids: list[list[int]],
    k: int,
    phase: str = "evaluation",
    trainer_state=None,
) -> torch.Tensor:
    """Rewards of ``k`` completions per row (completions ordered row by row), shape (len(rows), k). A reward of
    None (not applicable) counts as wrong, as NaN does in training."""
    from ..tasks.rewards import call_reward

    arguments = reward_arguments(rows, completions, completion_ids, k, trainer_state)
    rewards = call_reward(reward_func, phase, **arguments)
    values = [float("nan") if r is None else float(r) for r in rewards]
    return torch.tensor(values, dtype=torch.float).view(len(rows), k)


def _result(scores: torch.Tensor, groups: list[str] | None = None) -> EvalResult:
    """avg@k and best@k of (rows, k) rewards; with ``groups`` (one name per row) also avg@k per group, in order of
    first appearance (a task with halves: accuracy on each half, from the same completions)."""
    correct = scores > 0
    by_group = None
    if groups is not None:
        by_group = {
            g: float(correct[[i for i, x in enumerate(groups) if x == g]].float().mean()) for g in dict.fromkeys(groups)
        }
    return EvalResult(
        avg_at_k=float(correct.float().mean()),
        best_at_k=float(correct.any(dim=1).float().mean()),
        k=scores.shape[1],
        n=scores.shape[0],
        by_group=by_group,
    )


def kv_cache_bytes(config: dict, tokens: int, dtype_bytes: int = 2) -> int:
    """Key/value cache of one sequence of ``tokens`` tokens (K and V of every layer), from the model's config."""
    from ..planning.plan import ModelDims

    d = ModelDims.from_config(config)
    return 2 * d.layers * d.kv_heads * d.head_dim * dtype_bytes * tokens


def sequences_per_batch(
    config: dict, dtype_bytes: int, prompt_tokens: int, max_new_tokens: int, wanted: int, free_bytes: int | None
) -> int:
    """How many sequences one ``generate`` call may run: ``wanted``, bounded by the KV cache of full-length
    sequences (plus one fp32 logits row each) fitting in 90% of ``free_bytes`` (None: no bound, e.g. CPU RAM).
    Raises ValueError with the numbers when not even one sequence fits."""
    if free_bytes is None:
        return wanted
    vocab = int(config.get("text_config", config)["vocab_size"])
    per_sequence = kv_cache_bytes(config, prompt_tokens + max_new_tokens, dtype_bytes) + 2 * 4 * vocab
    fits = int(free_bytes * GENERATION_MEMORY_FRACTION) // per_sequence
    if fits < 1:
        raise ValueError(
            f"one sequence of {prompt_tokens} prompt + {max_new_tokens} new tokens needs "
            f"{per_sequence / 2**30:.2f} GiB of KV cache but only {free_bytes / 2**30:.2f} GiB is free; lower "
            "--max_new_tokens or use --backend vllm"
        )
    return min(wanted, fits)


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device (after the weights are loaded); None elsewhere (no bound on CPU RAM)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def least_free_bytes(accelerator) -> int | None:
    """The least free device memory over the ranks of ``accelerator``'s world (one agent's; None off CUDA). Ranks
    that generate together (FSDP / ZeRO-3, where every forward is a collective) must size their ``generate`` calls
    alike: a rank with more free memory would make fewer calls and leave the others waiting in a collective."""
    free = _free_bytes(accelerator.device)
    if free is None:
        return None
    return int(accelerator.gather(torch.tensor([free], device=accelerator.device)).min())


@torch.no_grad()
def evaluate_model(
    model,
    tokenizer,
    dataset,
    reward_func: Callable,
    *,
    k: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 16,
    batch_size: int = 64,
    chat_template_kwargs: dict | None = None,
    progress: bool = False,
    desc: str = "eval",
    memory_bytes: int | None = None,
    by: str | None = None,
    phase: str = "evaluation",
    trainer_state=None,
) -> EvalResult:
    """Score ``model`` on ``dataset`` (columns ``prompt`` and what ``reward_func`` needs, e.g. ``answer``).

    Each ``generate`` call runs at most ``batch_size`` problems x ``k`` samples, and on a GPU no more sequences than
    `sequences_per_batch` allows for the free memory (``memory_bytes`` stands in for it, e.g. in a CPU test).
    ``by``: a column of ``dataset`` (e.g. a task's ``half``) to report avg@k per value of, in ``by_group``; the
    generations are the same with or without it. ``reward_func`` is called as in training (`reward_arguments`,
    with ``trainer_state``); if it raises, a `RewardError` names it and ``phase``."""
    _check_sampling(k, temperature)
    rows = list(dataset)
    if by is not None and rows and by not in rows[0]:
        raise ValueError(f"evaluate_model(by={by!r}): the dataset has no such column; it has {list(rows[0])}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts = [_prompt_ids(tokenizer, r, chat_template_kwargs) for r in rows]
    free = memory_bytes if memory_bytes is not None else _free_bytes(device)
    dtype_bytes = next(model.parameters()).element_size()
    widest = max((len(p) for p in prompts), default=0)
    per_call = sequences_per_batch(model.config.to_dict(), dtype_bytes, widest, max_new_tokens, batch_size * k, free)
    if per_call < batch_size * k and progress:
        print(f"{desc}: generating {per_call} sequences at a time (KV cache bound; asked for {batch_size} x {k})")
    sequences = [(i, s) for i in range(len(rows)) for s in range(k)]
    completion_ids: list[list[int]] = []
    for start in tqdm(range(0, len(sequences), per_call), disable=not progress, desc=desc):
        chunk = [prompts[i] for i, _ in sequences[start : start + per_call]]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in chunk], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        completion_ids += [_until_eos(row, tokenizer.eos_token_id) for row in out[:, width:].tolist()]
    model.train(was_training)
    if not rows:
        return _result(torch.zeros(0, k))
    completions = trl_completions(tokenizer, rows, prompts, completion_ids, k)
    scores = _score(reward_func, rows, completions, completion_ids, k, phase, trainer_state)
    return _result(scores, None if by is None else [str(r[by]) for r in rows])


def evaluate_with_vllm(
    model_path: str,
    tokenizer,
    dataset,
    reward_func: Callable,
    *,
    k: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = MAIN_TABLE_NEW_TOKENS,
    chat_template_kwargs: dict | None = None,
    **llm_kwargs,
) -> EvalResult:
    """As :func:`evaluate_model`, generating with vLLM (GPU; ``pip install hacpo-trl[vllm]``). Not run by our CI."""
    _check_sampling(k, temperature)
    try:
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        raise ImportError("`--backend vllm` needs vLLM: pip install 'hacpo-trl[vllm]' (GPU only)") from exc
    rows = list(dataset)
    adapter = _lora_adapter(model_path)
    request = {}
    if adapter is None:
        llm = LLM(model=model_path, **llm_kwargs)
    else:
        # a LoRA agent: serve its base model and apply the adapter per request (no merged copy on disk)
        from vllm.lora.request import LoRARequest

        llm = LLM(model=adapter["base_model_name_or_path"], enable_lora=True, max_lora_rank=adapter["r"], **llm_kwargs)
        request["lora_request"] = LoRARequest("agent", 1, model_path)
    params = SamplingParams(n=k, temperature=max(temperature, 0.0), max_tokens=max_new_tokens)
    prompts = [_prompt_ids(tokenizer, r, chat_template_kwargs) for r in rows]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, **request)
    completion_ids = [list(c.token_ids) for o in outputs for c in o.outputs]
    completions = trl_completions(tokenizer, rows, prompts, completion_ids, k)
    return _result(_score(reward_func, rows, completions, completion_ids, k, "evaluation (hacpo-eval)"))


def _lora_adapter(path: str) -> dict | None:
    """A LoRA agent folder's adapter config (base model and rank), or None for a full model."""
    import json
    import os

    config = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config) or os.path.isfile(os.path.join(path, "config.json")):
        return None
    with open(config) as f:
        adapter = json.load(f)
    if not adapter.get("base_model_name_or_path"):
        raise ValueError(f"{config} names no `base_model_name_or_path`; cannot evaluate the adapter with vLLM")
    return {"base_model_name_or_path": adapter["base_model_name_or_path"], "r": int(adapter.get("r", 8))}


def eval_placement(path: str) -> tuple[str, torch.dtype | str]:
    """Where and in what dtype ``hacpo-eval`` runs an agent: on the available accelerator in the dtype it was saved
    in (its training dtype, from ``config.json``; ``"auto"`` for a LoRA folder), on CPU in float32 as before."""
    import json
    import os

    if torch.cuda.is_available():
        device = "cuda"
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        device = "mps"
    else:
        return "cpu", torch.float32
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return device, "auto"
    with open(config) as f:
        saved = json.load(f)
    name = saved.get("dtype") or saved.get("torch_dtype") or "float32"
    return device, getattr(torch, str(name).replace("torch.", ""))


def load_for_eval(path: str):
    """The agent's model, placed by :func:`eval_placement`."""
    from transformers import AutoModelForCausalLM

    device, dtype = eval_placement(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


# ------------------------------------------------------------------------------------------- benchmarks


@dataclass(frozen=True)
class Benchmark:
    """A dataset id and the columns holding the problem and the gold answer."""

    dataset: str
    split: str
    problem: str
    answer: str
    config: str | None = None
    instruction: bool = True  # append the boxed-answer instruction (the paper's protocol)


# The paper's benchmarks by their usual Hub ids (not reachable from our CI, so these ids are not exercised by the
# tests; any other dataset works through `--dataset` with `--problem_column` / `--answer_column`).
BENCHMARKS = {
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test", "problem", "answer"),
    "math": Benchmark("DigitalLearningGmbH/MATH-lighteval", "test", "problem", "solution"),
    "gsm8k": Benchmark("openai/gsm8k", "test", "question", "answer", config="main"),
    "aime2025": Benchmark("math-ai/aime25", "test", "problem", "answer"),
    "amc23": Benchmark("math-ai/amc23", "test", "question", "answer"),
    "minerva": Benchmark("math-ai/minervamath", "test", "question", "answer"),
    "olympiadbench": Benchmark("math-ai/olympiadbench", "test", "question", "final_answer"),
}


def _gold_answer(value) -> str:
    """The comparable gold answer: a solution's last boxed answer, GSM8K's '#### 42', or the value itself."""
    from ..tasks.rewards import last_boxed

    if isinstance(value, list | tuple):
        value = value[0] if value else ""
    text = str(value)
    if "####" in text:
        return text.split("####")[-1].strip().replace(",", "")
    return last_boxed(text) or text.strip()


def load_benchmark(bench: Benchmark):
    """The benchmark as a dataset with conversational ``prompt`` and ``answer`` columns."""
    from ..tasks.data import BOXED_INSTRUCTION, load_any_dataset

    data = load_any_dataset(bench.dataset, bench.config, bench.split)

    def convert(example):
        text = str(example[bench.problem]) + (f" {BOXED_INSTRUCTION}" if bench.instruction else "")
        return {"prompt": [{"role": "user", "content": text}], "answer": _gold_answer(example[bench.answer])}

    return data.map(convert, remove_columns=data.column_names)


# ------------------------------------------------------------------------------ the built-in tasks, as trained

BUILTIN_TASKS = ("arithmetic", "arithmetic_fewshot", "arithmetic_trace", "arithmetic_trace_carries")
TASK_RECORD = "hacpo_task.json"  # written next to each saved agent by `hacpo-train`: what it was trained on


def eval_length(task: str, max_completion_length: int) -> int:
    """Generation length of held-out evaluation: the built-in short-answer task at most 16 tokens, every other task
    the full completion length (training's own evaluation and `hacpo-eval` alike)."""
    return min(16, max_completion_length) if task == "arithmetic" else max_completion_length


def builtin_eval(task: str, max_completion_length: int | None = None, split: str = "test"):
    """The held-out ``split`` of a built-in task, its reward and the generation length, exactly as a training run
    evaluates it (so that `hacpo-eval` reproduces the run's summary). Without the run's completion length: 64
    tokens for worked solutions, 8 for short answers."""
    from ..tasks.data import task_splits
    from ..tasks.rewards import get_reward_funcs, task_reward_funcs

    splits = task_splits(task)
    if split not in splits:
        raise ValueError(f"task {task!r} has no {split!r} split")
    reward = get_reward_funcs(task_reward_funcs(task))[0]
    if max_completion_length is None:
        return splits[split], reward, 64 if task.startswith("arithmetic_trace") else 8
    return splits[split], reward, eval_length(task, max_completion_length)


def trained_task(path: str) -> dict | None:
    """What the agent in ``path`` was trained on (task, eval split and size, completion length, chat
    template kwargs), or None for a
    model that `hacpo-train` did not save."""
    import json
    import os

    record = os.path.join(path, TASK_RECORD)
    if not os.path.isfile(record):
        return None
    with open(record) as f:
        return json.load(f)
