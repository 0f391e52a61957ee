"""The launch plan's arithmetic: who runs where, how batches split, what each rank holds in memory, what saving costs.

Pure Python (no torch, no trl): every figure comes from the recipe, the launch (accelerate config or environment) and
each model's ``config.json``, so a user can check a GPU recipe on a laptop. `hacpo_trl.launch.plan_cli` reads the files
and prints the plan; ``hacpo-train --config R --plan`` calls it.

The memory model is an estimate, written out term by term so that each line can be checked by hand against
DeepSpeed, TRL 1.16 and the ZeRO paper, and measured on one GPU (``tests/test_one_gpu.py``):

* bytes per parameter follow the parallelism: plain DDP keeps the weights in their load dtype (TRL loads float32
  unless ``model_init_kwargs.dtype`` says otherwise) plus gradients, DDP's gradient buckets (``gradient_as_bucket_view``
  is off) and AdamW's two moments in the parameter dtype; DeepSpeed ZeRO with bf16 keeps bf16 weights and shards an
  fp32 master copy and fp32 Adam moments (stage >= 1) over the agent's ranks. Its gradient partitions (stage >= 2)
  are bf16 (DeepSpeed's default ``grad_accum_dtype`` is the model dtype), but two of them coexist during each
  accumulation backward, so 4 bytes per parameter / N; one reduce bucket (``overlap_comm`` is off for stage 2 by
  default; the all-gather is in place). That is DeepSpeed's own ``estimate_zero2_model_states_mem_needs``. FSDP
  shards float32 weights (accelerate upcasts trainable low-precision parameters under mixed precision), gradients
  and Adam moments;
* the reference model exists only for full fine-tuning with ``beta > 0`` (LoRA disables the adapter instead), in the
  training dtype (bf16 under DeepSpeed, where TRL prepares it as a stage-0 bf16 engine);
* vLLM colocate reserves ``vllm_gpu_memory_utilization`` x device memory on every rank; with
  ``vllm_enable_sleep_mode`` that memory is released for the training passes (TRL sleeps vLLM at level 2), so the
  peak is the larger of the two phases;
* activations assume the worst case: every row of a forward pass as long as ``vllm_max_model_length`` (or the
  completion budget plus the longest prompt of the task as the agent's tokenizer and chat template make it; 1,024
  tokens when the prompts cannot be read) and every completion at ``max_completion_length``. They are the
  checkpointed layer inputs, one decoder layer recomputed (what HF eager saves per token, see
  `layer_bytes_per_token`, plus 50% for backward transients) and TRL 1.16's fused LM head, which never builds the
  (rows x tokens x vocab) logits (see `lm_head_bytes`). HACPO runs ``n_agents x per_device_train_batch_size`` rows
  per forward (own and peer rows), not ``per_device_train_batch_size``;
* without vLLM, transformers' ``generate`` runs a rank's whole generation batch in one call: its KV cache grows to
  rows x (longest prompt + completion) tokens, in the model's dtype, while the training states are held; the
  training passes come after it, so the peak is the larger of the two phases;
* fixed allowances, split: the CUDA context, NCCL communicators (one for the agent's world; a second for its
  data-parallel traffic when it has several processes) and allocator fragmentation: small with expandable segments
  (what ``hacpo-train`` sets unless the user chose allocator settings), a few GiB without (see the constants);
* several agents on one GPU (``share_gpus``) add up: each process's peak, summed over the processes of each GPU.

`error_bar` says how far the peak could be off and why. Not modelled: vLLM's CUDA graphs beyond its profiling
allowance, tensor parallelism in vLLM, ZeRO offload, ZeRO-3 prefetch buffers, FSDP2's unsharded layer buffers,
quantised models, and anything about speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..run.resolve import ResolvedAgent, ResolvedRecipe, resolve
from ..run.schedule import (
    ends_inside_batch,
    generation_groups_problem,
    solo_fits,
    update_schedule_problem,
    updates_within_batches,
)
from ..sharing.presets import describe_sharing, expand_sharing
from ..sharing.settings import SharingSettings

__all__ = [
    "GIB",
    "Launch",
    "ModelDims",
    "Plan",
    "format_plan",
    "launch_from_accelerate",
    "launch_from_env",
    "make_plan",
]

GIB = 1024**3
# Fixed allowances per GPU rank (not measured here; the ranges quoted are typical):
CUDA_CONTEXT_GIB = 0.75  # the trainer process's CUDA context + cuBLAS workspaces: 0.5-0.8 GiB on A100/H100
NCCL_GIB_PER_COMMUNICATOR = 0.7  # 0.5-0.7 GiB per communicator that carries traffic (NVIDIA/nccl#964); more with NVLS
# the world group (exchange, accelerate gathers) + the agent's data-parallel group (or DeepSpeed's clone of the world
# group); 1 for an agent of one process
NCCL_COMMUNICATORS = 2
FRAGMENTATION_GIB = 3.0  # reserved-but-unallocated memory in variable-length RL: 1-5 GiB is typical (trl#2927)
# With expandable segments: 0.7 and 0.3 GiB measured for Qwen3-4B / 1.7B shapes on one H200 (LoRA, HF generate).
# Without them HF generate's growing KV cache made the same 4B agent reserve 71.8 GiB for 15.7 allocated.
EXPANDABLE_FRAGMENTATION_GIB = 0.75
SERVER_UTILIZATION = 0.9  # `trl vllm-serve`'s default --gpu_memory_utilization
QUEUE_FACTOR = 4  # flag a vLLM engine that runs fewer than 1/4 of a generation batch's requests at once
VLLM_OVERHEAD_GIB = 2.0  # vLLM's profiling activations and CUDA graphs inside its share
DS_BUCKET_ELEMENTS = 5e8  # DeepSpeed's default reduce_bucket_size and allgather_bucket_size (elements)
FUSED_HEAD_TOKENS, FUSED_HEAD_VOCAB = 4096, 32768  # TRL 1.16's fused LM head tile (chunked_logprob.py)
BACKWARD_TRANSIENTS = 1.5  # a recomputed layer's backward adds 30-60% of what it saves
DEVICE_GIB = 79.2  # what torch can use on an 80 GB H100/A100 (OOM messages quote 79.1-79.3 GiB)
DEFAULT_PROMPT_TOKENS = 1024  # prompt allowance when `vllm_max_model_length` is not set
DATASET_ROWS = {"DigitalLearningGmbH/MATH-lighteval": 7500}  # MATH train split (Hendrycks et al., 2021)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
_LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --------------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a dense decoder (Llama / Qwen2 / Qwen3 family) that memory depends on."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_position: int
    tied: bool
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k (head_dim weights each)
    qkv_bias: bool = False  # Qwen2: biases on q, k, v

    @classmethod
    def from_config(cls, config: dict) -> ModelDims:
        """From a ``config.json`` mapping; raises ValueError naming a missing key."""
        cfg = config.get("text_config", config)
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            return cls(
                hidden=hidden,
                layers=int(cfg["num_hidden_layers"]),
                intermediate=int(cfg["intermediate_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                vocab=int(cfg["vocab_size"]),
                max_position=int(cfg["max_position_embeddings"]),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qk_norm=cfg.get("model_type") == "qwen3",
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)),
            )
        except KeyError as exc:
            raise ValueError(f"config.json has no {exc.args[0]!r}; the plan handles dense decoder models") from None

    def _linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def params(self) -> int:
        """Parameter count: embeddings, per layer (linears, two RMSNorms, Qwen3's q/k norms, Qwen2's biases), the
        final norm and an untied LM head."""
        layer = sum(a * b for a, b in self._linears().values()) + 2 * self.hidden
        layer += 2 * self.head_dim if self.qk_norm else 0
        layer += (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * layer + self.hidden

    def lora_params(self, r: int, target_modules) -> int:
        """Trainable parameters of LoRA rank ``r``: r x (in + out) per targeted linear of every layer."""
        if target_modules in ("all-linear", None):
            targets = _LORA_ALL_LINEAR
        else:
            targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        per_layer = sum(r * (a + b) for name, (a, b) in self._linears().items() if name in targets)
        return self.layers * per_layer

    def layer_bytes_per_token(self, act_bytes: int = 2) -> int:
        """What one HF-eager decoder layer saves for its backward, per token, in ``act_bytes`` activations: its two
        RMSNorms 8h each (input + fp32 upcast + output: 2h + 4h + 2h in bf16); attention's q, k and v (k and v
        repeated to all heads: under a padding mask SDPA does not use GQA), its output and o_proj's input, 5 q-wide
        tensors; Qwen3's q/k RMSNorms, 3 bytes per element each side of the norm (6 (q + kv)); SwiGLU's gate, up,
        act(gate) and their product, 4 I-wide tensors. Qwen3-4B: 40,960 + 40,960 + 30,720 + 77,824 = 190,464 B."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        scale = act_bytes / 2
        norms = 16 * self.hidden
        attention = 10 * q
        qk_norm = 6 * (q + kv) if self.qk_norm else 0
        mlp = 8 * self.intermediate
        return int((norms + attention + qk_norm + mlp) * scale)

    @property
    def kv_bytes_per_token(self) -> int:
        """vLLM's bf16 KV cache per token: K and V of every layer (transformers' cache is the same in bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


# --------------------------------------------------------------------------------------------------- launch


@dataclass(frozen=True)
class Launch:
    """How the processes are started: parallelism inside each agent and the hardware."""

    parallelism: str  # "cpu", "ddp", "zero" or "fsdp"
    num_processes: int | None = None  # None: take the recipe's total
    num_machines: int = 1
    zero_stage: int = 0
    mixed_precision: str | None = None  # "bf16", "fp16", "no"; None when unknown
    gpu_ids: tuple[int, ...] | None = None
    source: str = "assumed"
    gpus_per_node: int | None = None  # None: the gpu_ids listed, else one per process (read with `share_gpus`)

    @property
    def label(self) -> str:
        return {"cpu": "CPU (gloo)", "ddp": "DDP", "fsdp": "FSDP"}.get(self.parallelism, f"ZeRO-{self.zero_stage}")


def launch_from_accelerate(cfg: dict, source: str = "accelerate config") -> Launch:
    """From an accelerate config file's mapping (``distributed_type``, ``deepspeed_config``, ...)."""
    kind = str(cfg.get("distributed_type", "NO")).upper()
    gpu_ids = cfg.get("gpu_ids")
    ids = None
    if isinstance(gpu_ids, str) and gpu_ids not in ("all", ""):
        ids = tuple(int(x) for x in gpu_ids.split(","))
    elif isinstance(gpu_ids, int):
        ids = (gpu_ids,)
    parallelism, stage = "ddp", 0
    if kind == "DEEPSPEED":
        parallelism, stage = "zero", int((cfg.get("deepspeed_config") or {}).get("zero_stage", 2))
    elif kind == "FSDP":
        parallelism = "fsdp"
    elif cfg.get("use_cpu") or kind in ("CPU", "MULTI_CPU"):
        parallelism = "cpu"
    return Launch(
        parallelism=parallelism,
        num_processes=int(cfg.get("num_processes", 1)),
        num_machines=int(cfg.get("num_machines", 1)),
        zero_stage=stage,
        mixed_precision=cfg.get("mixed_precision"),
        gpu_ids=ids,
        source=source,
    )


def launch_from_env(env: dict) -> Launch | None:
    """From the variables `accelerate launch` sets in every process; None outside a launch."""
    if "WORLD_SIZE" not in env:
        return None
    true = ("true", "1", "yes")
    if str(env.get("ACCELERATE_USE_DEEPSPEED", "")).lower() in true:
        parallelism, stage = "zero", int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", 2))
    elif str(env.get("ACCELERATE_USE_FSDP", "")).lower() in true:
        parallelism, stage = "fsdp", 0
    else:
        parallelism, stage = ("cpu" if str(env.get("ACCELERATE_USE_CPU", "")).lower() in true else "ddp"), 0
    world, local = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    return Launch(
        parallelism=parallelism,
        num_processes=world,
        num_machines=max(1, world // max(local, 1)),
        zero_stage=stage,
        mixed_precision=env.get("ACCELERATE_MIXED_PRECISION"),
        source="launch environment",
    )


# ----------------------------------------------------------------------------------------------------- plan


@dataclass
class AgentPlan:
    name: str
    model: str
    ranks: list[int]
    devices: list[str]
    params: int
    trainable: int
    batch: dict[str, object]
    memory: dict[str, float]  # GiB per rank, by item
    peak_gib: float
    checkpoint_gib: float
    vllm: dict[str, float] = field(default_factory=dict)
    error_gib: tuple[float, float] = (0.0, 0.0)  # the peak may be this much lower / higher (see `error_bar`)
    checkpoint_parts: dict[str, float] = field(default_factory=dict)  # GiB per file of one checkpoint
    final_model_gib: float = 0.0


@dataclass
class Plan:
    agents: list[AgentPlan]
    launch: Launch
    device_gib: float | None  # None on CPU
    schedule: dict[str, object]
    problems: list[str]
    notes: list[str]
    fixes: list[str] = field(default_factory=list)  # what would make a plan that does not fit memory fit (`fixes`)

    @property
    def ok(self) -> bool:
        return not self.problems


def learner_settings(agent: ResolvedAgent) -> SharingSettings:
    """The agent's sharing settings as training checks and reads them: its named mode's values where the recipe
    leaves a setting out, then :class:`~hacpo_trl.sharing.settings.SharingSettings`' defaults."""
    return SharingSettings.from_values(expand_sharing(agent.settings), f"agent {agent.name!r}: ")


def batch_arithmetic(
    agent: ResolvedAgent, n_ranks: int, n_agents: int, learner: SharingSettings | None = None
) -> dict[str, object]:
    """The generation batch and how it is cut into forward passes and optimizer updates, per agent (TRL 1.16:
    ``generation_batch_size = per_device_train_batch_size x world x steps_per_generation``; HACPO appends the peers'
    rows to each rank's own and splits the whole into ``steps_per_generation`` micro-batches, own rows first).
    ``learner``: the agent's :func:`learner_settings`, where the caller has them."""
    get = agent.get  # the agent's settings: the run's, its own fields, its overrides
    learner = learner if learner is not None else learner_settings(agent)
    per_device = int(get("per_device_train_batch_size", 8))
    ga = int(get("gradient_accumulation_steps", 1))
    spg = get("steps_per_generation")
    gen = get("generation_batch_size")
    if spg is None:
        spg = gen // (per_device * n_ranks) if gen else ga
    spg = int(spg)
    iterations = int(get("num_iterations", 1))
    num_generations = int(get("num_generations", 8))
    sharing = bool(expand_sharing(agent.settings)["share_rollouts"]) and n_agents > 1  # the mode's, if left out
    own_per_rank = per_device * spg
    peer_per_rank = (n_agents - 1) * own_per_rank if sharing else 0
    rows_per_forward = (own_per_rank + peer_per_rank) // spg
    per_update = []
    # each update is GA micro-steps; micro-step m trains micro-batch (m mod S)
    if updates_within_batches(spg * iterations, ga):
        for u in range(max(1, spg * iterations // ga)):
            own = sum(max(0, min((m % spg + 1) * rows_per_forward, own_per_rank) - m % spg * rows_per_forward)
                      for m in range(u * ga, (u + 1) * ga))  # fmt: skip
            per_update.append({"own": own * n_ranks, "peer": (ga * rows_per_forward - own) * n_ranks})
    solo = learner.solo_steps_per_generation
    solo = int(solo) if sharing and solo else None  # the trainer checks that it divides into whole updates
    # a batch with rescued or taught peer rows only (`capability_gate_rescue`, `taught_schedule: solo`) adds them to
    # the solo micro-batches: at most all
    few = solo and (learner.capability_gate_rescue or learner.taught_schedule == "solo")
    # per-prompt sharing with taught rows on the solo schedule never uses the sharing schedule: without
    # `solo_steps_per_generation` every batch is cut as GSPO cuts this recipe's, taught rows joining its updates
    gspo = sharing and not solo and learner.peer_prompts != "all" and learner.taught_schedule == "solo"
    return {
        "gspo_schedule": gspo,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": ga,
        "steps_per_generation": spg,
        "num_iterations": iterations,
        "num_generations": num_generations,
        "sharing": sharing,
        "completions_per_generation": per_device * n_ranks * spg,
        "prompts_per_generation": per_device * n_ranks * spg / num_generations,
        "own_completions_per_rank": own_per_rank,
        "peer_rows_per_rank": peer_per_rank,
        "rows_per_forward": rows_per_forward,
        "updates_per_generation": spg * iterations / ga,
        "rows_per_update": per_update,
        # a batch at which the agent learns from no one (`solo_steps_per_generation`): its own rows only, in `solo`
        # micro-batches; the batch's other updates are skipped
        "solo_steps_per_generation": solo,
        "solo_updates": solo * iterations / ga if solo else None,
        "solo_rows_per_update": own_per_rank * n_ranks * ga // solo if solo else None,
        "solo_rows_per_forward": own_per_rank // solo if solo else None,
        "few_prompts_rows_per_forward": own_per_rank // solo + -(-peer_per_rank // solo) if few else None,
    }


def forward_rows(batch: dict) -> int:
    """The largest forward pass the agent runs: a solo batch's forwards hold more rows when its micro-batches are
    fewer than the own rows' share of the sharing schedule's, and a batch of rescued or taught peer rows adds them."""
    solo = [int(batch.get(k) or 0) for k in ("solo_rows_per_forward", "few_prompts_rows_per_forward")]
    return max(int(batch["rows_per_forward"]), *solo)


def _dtype_bytes(value, default: int) -> int:
    if value is None:
        return default
    name = str(value).replace("torch.", "")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"model_init_kwargs.dtype {value!r} is not one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def memory_per_rank(
    dims: ModelDims,
    trainable: int,
    lora: bool,
    launch: Launch,
    n_ranks: int,
    load_bytes: int,
    beta: float,
    rows_per_forward: int,
    seq_len: int,
    completion_len: int,
    gradient_checkpointing: bool,
    vllm_gib: float,
    on_gpu: bool = True,
    fused_lm_head: bool = True,
    generation_rows: int = 0,
    expandable_segments: bool = False,
) -> dict[str, float]:
    """GiB per rank, item by item (see the module docstring for the model behind each line). ``generation_rows``:
    rows of transformers' one ``generate`` call per generation batch (0 with vLLM)."""
    p, t, n = dims.params, trainable, n_ranks
    frozen = p - t if lora else 0
    if launch.parallelism == "zero":
        s = launch.zero_stage
        w = 2 if launch.mixed_precision in ("bf16", "fp16") else 4
        master = 4 * t if w == 2 else 0
        weights = (p * w) / (n if s >= 3 else 1)
        items = {
            "weights": weights,
            "fp32 master weights": master / (n if s >= 1 else 1),
            "gradients": (2 * w * t / n) if s >= 2 else w * t,  # two bf16 partitions during accumulation
            "optimizer state": 8 * t / (n if s >= 1 else 1),
            "gradient buckets": w * min(DS_BUCKET_ELEMENTS, t),  # one reduce bucket; the all-gather is in place
        }
        ref_bytes = p * w / (n if s >= 3 else 1)
        residual_bytes = w
    else:
        shard = n if launch.parallelism == "fsdp" else 1
        # FSDP upcasts trainable weights to fp32, and peft keeps LoRA adapters in fp32; a frozen base keeps its dtype
        w = 4 if launch.parallelism == "fsdp" or lora else load_bytes
        lw = load_bytes
        items = {
            "weights": (t * w + frozen * lw) / shard,
            "gradients": t * w / shard,
            "optimizer state": 2 * t * w / shard,
        }
        if launch.parallelism == "ddp" and n > 1:
            items["gradient buckets"] = t * w
        ref_bytes = p * load_bytes / shard
        residual_bytes = lw if lora else w  # autocast keeps the residual stream in the weights' dtype
    items["reference model"] = ref_bytes if beta > 0 and not lora else 0.0
    act = residual_bytes if residual_bytes in (2, 4) else 2
    tokens = rows_per_forward * seq_len
    layer = tokens * dims.layer_bytes_per_token(act)
    # gradient checkpointing keeps every layer's input and recomputes one layer at a time, with its transients
    if gradient_checkpointing:
        layers = tokens * dims.hidden * dims.layers * residual_bytes + layer * BACKWARD_TRANSIENTS
    else:
        layers = layer * dims.layers + layer * (BACKWARD_TRANSIENTS - 1)
    head = lm_head_bytes(dims, rows_per_forward * completion_len, head_trainable=not lora, launch=launch, w=w)
    # TRL < 1.16 materialised the completion logits: bf16 logits + saved log-softmax
    if not fused_lm_head:
        head = rows_per_forward * completion_len * dims.vocab * 4
    items["activations"] = layers + head
    # transformers' KV cache holds K and V of every layer in the weights' dtype as it runs the generation
    items["generation KV cache"] = generation_rows * seq_len * dims.kv_bytes_per_token * residual_bytes / 2
    out = {k: v / GIB for k, v in items.items()}
    out["vLLM reservation"] = vllm_gib
    if on_gpu:
        out["CUDA context"] = CUDA_CONTEXT_GIB
        out["NCCL communicators"] = NCCL_GIB_PER_COMMUNICATOR * (NCCL_COMMUNICATORS if n > 1 else 1)
        out["fragmentation allowance"] = EXPANDABLE_FRAGMENTATION_GIB if expandable_segments else FRAGMENTATION_GIB
    return out


PHASES = ("activations", "generation KV cache", "vLLM reservation")  # what is held only part of the step


def lm_head_bytes(dims: ModelDims, scored_tokens: int, head_trainable: bool, launch: Launch, w: int) -> float:
    """TRL 1.16's fused LM head (``add_fused_lm_head``; ``kernels/chunked_logprob.py``): log-probs from 4,096-token x
    32,768-vocab tiles, never the (rows x tokens x vocab) logits. Its backward holds an fp32 gradient of the hidden
    states (4 h per scored token), one bf16 tile, and for a trainable head an fp32 V x h weight-gradient accumulator
    plus its cast to the weight dtype (4 V h + w V h); with tied embeddings that gradient stays in autograd's buffer
    until the embedding's backward (counted in the cast). A frozen head (LoRA) skips the weight gradient (trl#7076).
    Under FSDP the head is gathered whole (``weight.full_tensor()``): + w V h."""
    vh = dims.vocab * dims.hidden
    total = 4 * dims.hidden * scored_tokens + FUSED_HEAD_TOKENS * FUSED_HEAD_VOCAB * 2
    if head_trainable:
        total += 4 * vh + w * vh
    if launch.parallelism == "fsdp":
        total += w * vh
    return float(total)


def checkpoint_parts(dims: ModelDims, trainable: int, lora: bool, launch: Launch, load_bytes: int) -> dict[str, float]:
    """One saved checkpoint of one agent, file by file (bytes): the model (or adapter) weights plus what resume needs.
    Full fine-tuning under ZeRO with bf16 is 16 bytes per parameter: ``model.safetensors`` (2), DeepSpeed's
    ``global_stepN/mp_rank_00_model_states.pt``, the whole bf16 module again (2), and the optimizer partitions: fp32
    master weights (4) and Adam's m and v (8)."""
    t, p = trainable, dims.params
    if launch.parallelism == "zero":
        w = 2 if launch.mixed_precision in ("bf16", "fp16") else 4
        if lora:  # peft keeps adapters in fp32
            return {"adapter": 4 * t, "fp32 master + Adam m, v": 12 * t}
        parts = {"model.safetensors": w * p, "DeepSpeed module states": w * p}
        if w == 2:
            parts["fp32 master weights"] = 4 * t
        parts["Adam m, v"] = 8 * t
        return parts
    if lora:
        return {"adapter": 4 * t, "Adam m, v": 8 * t}  # fp32 adapters and their Adam moments
    w = 4 if launch.parallelism == "fsdp" else load_bytes
    return {"model": p * w, "Adam m, v": 2 * t * w}


def final_model_bytes(dims: ModelDims, trainable: int, lora: bool, launch: Launch, load_bytes: int) -> float:
    """The final ``save_model()``: the adapter, or the model in its training dtype."""
    if lora:
        return 4.0 * trainable
    w = 2 if launch.parallelism == "zero" and launch.mixed_precision in ("bf16", "fp16") else load_bytes
    return float(dims.params * (4 if launch.parallelism == "fsdp" else w))


def error_bar(memory: dict[str, float], layer_gib: float, zero2_grad_gib: float, colocate: bool) -> tuple[float, float]:
    """How far below / above the peak the truth may lie (GiB), from the ranges of the terms the plan cannot pin down:
    fragmentation 1-5 GiB (allowance 3; 0.3-1 with expandable segments, allowance 0.75); NCCL 0.5-0.7 GiB per
    communicator, up to ~1 GiB more with NVLS on NVSwitch; the CUDA context 0.5-0.8 (0.75); the recomputed layer's
    backward transients +30-60% (+50%); an older DeepSpeed with one bf16 gradient partition instead of two; vLLM
    under-reserving its graphs and sampler (<= 0.5 GiB)."""
    if "fragmentation allowance" not in memory:
        return 0.0, 0.0
    expandable = memory["fragmentation allowance"] == EXPANDABLE_FRAGMENTATION_GIB
    low_frag, high_frag = (0.45, 0.25) if expandable else (2.0, 2.0)
    low = low_frag + 0.4 + 0.25 + 0.2 * layer_gib + zero2_grad_gib
    high = high_frag + 1.0 + 0.05 + 0.1 * layer_gib + (0.5 if colocate else 0.0)
    return low, high


def make_plan(
    recipe: dict,
    dims: dict[str, ModelDims],
    launch: Launch,
    device_gib: float | None = DEVICE_GIB,
    dataset_rows: int | None = None,
    fused_lm_head: bool = True,
    prompt_tokens: dict[str, int] | None = None,
    expandable_segments: bool = False,
    resolved: ResolvedRecipe | None = None,
) -> Plan:
    """The whole plan. ``dims`` maps agent name -> its model's dimensions; ``device_gib`` is one GPU's memory
    (None: CPU); ``fused_lm_head`` is False for a TRL older than 1.16 (materialised logits); ``prompt_tokens`` maps
    agent name -> its longest prompt in tokens (missing: 1,024); ``expandable_segments``: the CUDA allocator's
    setting; ``resolved``: the agents of ``recipe`` where the caller has resolved them (one reading per process).
    ``problems`` lists what will not run; an empty list means the plan passes."""
    recipe = expand_sharing(recipe)  # a named sharing mode, as the config reads it
    resolved = resolved if resolved is not None else resolve(recipe)
    problems: list[str] = []
    notes: list[str] = []
    total = sum(resolved.process_counts)
    world = launch.num_processes or total
    if world != total:
        problems.append(f"the recipe's agents add up to {total} processes but the launch starts {world}")
    on_cpu = bool(recipe.get("use_cpu")) or launch.parallelism == "cpu"
    if on_cpu:
        device_gib = None
    per_node = max(1, world // max(launch.num_machines, 1))
    shared = bool(recipe.get("share_gpus"))
    gpus = launch.gpus_per_node or (len(launch.gpu_ids) if launch.gpu_ids else per_node)
    mp = launch.mixed_precision
    if not on_cpu and mp is not None:
        bf16 = recipe.get("bf16")
        bf16 = not recipe.get("fp16") if bf16 is None else bf16  # TRL's default: bf16 unless fp16
        recipe_mp = "bf16" if bf16 else "fp16" if recipe.get("fp16") else "no"
        if mp != recipe_mp:
            problems.append(
                f"the launch uses mixed_precision {mp!r} but the recipe says {recipe_mp!r} (bf16/fp16 keys); "
                "make them agree (DeepSpeed refuses a mismatch)"
            )

    n_agents = len(resolved.agents)
    completion = int(recipe.get("max_completion_length", 512))  # equal for every agent (SHARED_SETTINGS)
    agents: list[AgentPlan] = []
    learners: dict[str, SharingSettings] = {}  # each agent's sharing settings, checked as the config checks them
    schedules = []
    start = 0
    for agent in resolved.agents:
        name, n, get = agent.name, agent.spec.num_processes, agent.get
        ranks = list(range(start, start + n))
        start += n
        if on_cpu:
            devices = ["cpu"] * n
        else:
            devices = []
            for g in ranks:
                node, local = divmod(g, per_node)
                local = local % gpus if shared else local  # placement's round robin over the node's GPUs
                gpu = launch.gpu_ids[local] if launch.gpu_ids and local < len(launch.gpu_ids) else local
                devices.append(f"node {node} GPU {gpu}" if launch.num_machines > 1 else f"GPU {gpu}")
        d = dims[name]
        lora_cfg = agent.spec.lora
        lora = lora_cfg is not None
        trainable = d.lora_params(int(lora_cfg.get("r", 8)), lora_cfg.get("target_modules")) if lora else d.params
        learners[name] = learner_settings(agent)
        batch = batch_arithmetic(agent, n, n_agents, learners[name])
        init = get("model_init_kwargs") or {}
        load_bytes = _dtype_bytes(init.get("dtype"), 4)
        beta = float(get("beta", 0.0))
        max_len = get("vllm_max_model_length")
        prompt = (prompt_tokens or {}).get(name)
        prompt = prompt if prompt is not None else DEFAULT_PROMPT_TOKENS
        seq = int(max_len) if max_len else completion + prompt
        batch["prompt_tokens"] = seq - completion  # the rows' prompt allowance (balance's cost model reads it)
        util = float(get("vllm_gpu_memory_utilization", 0.3))
        use_vllm, vllm_mode = bool(get("use_vllm")), get("vllm_mode", "colocate")
        colocate = use_vllm and vllm_mode == "colocate" and not on_cpu
        vllm_gib = util * device_gib if colocate and device_gib else 0.0
        memory = memory_per_rank(
            d,
            trainable,
            lora,
            launch,
            n,
            load_bytes,
            beta,
            forward_rows(batch),
            seq,
            completion,
            bool(get("activation_checkpointing", get("gradient_checkpointing", True))),
            vllm_gib,
            on_gpu=not on_cpu,
            fused_lm_head=fused_lm_head,
            generation_rows=0 if use_vllm or on_cpu else int(batch["own_completions_per_rank"]),
            expandable_segments=expandable_segments,
        )
        sleep = bool(get("vllm_enable_sleep_mode", False))
        states = sum(v for k, v in memory.items() if k not in PHASES)
        if sleep and colocate:
            peak = states + max(memory["activations"], vllm_gib)
        else:  # transformers' generation (its KV cache) and the training passes take turns
            peak = states + max(memory["activations"], memory["generation KV cache"]) + vllm_gib
        server = use_vllm and vllm_mode == "server" and not on_cpu
        vllm: dict[str, float] = {}
        if (colocate or server) and device_gib:
            model_len = int(max_len) if max_len else d.max_position
            if colocate:
                # each rank's engine generates that rank's completions, at most TRL's max_num_seqs at once
                engine_gib, requests = vllm_gib, int(batch["own_completions_per_rank"])
                max_seqs = int(batch["per_device_train_batch_size"]) * int(batch["steps_per_generation"])
            else:
                # one `trl vllm-serve` (default --gpu_memory_utilization 0.9) gets the agent's whole batch
                engine_gib, requests = SERVER_UTILIZATION * device_gib, int(batch["completions_per_generation"])
                max_seqs = requests
            kv_budget = engine_gib - 2 * d.params / GIB - VLLM_OVERHEAD_GIB
            one = model_len * d.kv_bytes_per_token / GIB
            kv_tokens = max(0, int(kv_budget * GIB // d.kv_bytes_per_token))
            concurrent = min(max_seqs, kv_tokens // model_len)
            vllm = {
                "mode": "colocate" if colocate else "server",
                "engine_gib": engine_gib,
                "max_model_len": model_len,
                "kv_cache_gib": kv_budget,
                "kv_tokens": kv_tokens,
                "one_request_gib": one,
                "concurrent_seqs": concurrent,
                "requests": requests,
                "sleep_mode": sleep and colocate,
            }
            if max_len is None:
                notes.append(
                    f"agent {name!r}: `vllm_max_model_length` is not set, so vLLM sizes for the model's "
                    f"{d.max_position:,}-token context; set it to prompt + max_completion_length (e.g. {seq})"
                )
            if kv_budget < one:
                problems.append(
                    f"agent {name!r}: vLLM's KV cache ({kv_budget:.1f} GiB left of {engine_gib:.1f} GiB after "
                    f"{2 * d.params / GIB:.1f} GiB of bf16 weights) cannot hold one {model_len:,}-token request "
                    f"({one:.1f} GiB); vLLM would refuse to start"
                )
            elif concurrent * QUEUE_FACTOR < requests:
                hint = (
                    "raise vllm_gpu_memory_utilization (with vllm_enable_sleep_mode the training passes get that "
                    "memory back)"
                    if colocate
                    else "give the server more memory or a tensor-parallel group"
                )
                notes.append(
                    f"agent {name!r}: vLLM holds {kv_tokens:,} KV tokens = {concurrent} sequences of {model_len:,} "
                    f"tokens at once against {requests} requests per generation batch; the rest queue (worst case "
                    f"~{math.ceil(requests / max(concurrent, 1))} rounds); {hint}"
                )
        if max_len is not None and int(max_len) <= completion:
            problems.append(
                f"agent {name!r}: vllm_max_model_length {max_len} leaves no room for a prompt before "
                f"max_completion_length {completion}"
            )
        if max_len is not None and int(max_len) > d.max_position:
            problems.append(
                f"agent {name!r}: vllm_max_model_length {max_len} exceeds the model's context {d.max_position:,}"
            )
        if device_gib is not None and peak > device_gib:
            worst = ", ".join(f"{k} {v:.1f}" for k, v in sorted(memory.items(), key=lambda kv: -kv[1])[:3])
            problems.append(
                f"agent {name!r} (global ranks {ranks[0]}-{ranks[-1]}): about {peak:.1f} GiB per rank does not fit "
                f"a {device_gib:.1f} GiB device (largest: {worst} GiB)"
            )
        if not lora and launch.parallelism == "ddp" and load_bytes == 2:
            problems.append(
                f"agent {name!r}: full fine-tuning with bf16 weights under DDP makes AdamW update bf16 parameters, "
                "which rounds away small updates; load float32 or use ZeRO (fp32 master weights)"
            )
        schedule = (batch["steps_per_generation"], batch["num_iterations"], batch["gradient_accumulation_steps"])
        straddles = update_schedule_problem(*schedule) if batch["sharing"] else None  # as `HACPOConfig` refuses it
        if straddles:
            problems.append(f"agent {name!r}: {straddles}")
        solo = learners[name].solo_steps_per_generation  # checked for every agent, as the config does
        if solo and not solo_fits(int(solo), batch["steps_per_generation"], batch["gradient_accumulation_steps"]):
            problems.append(
                f"agent {name!r}: solo_steps_per_generation {solo} must divide steps_per_generation "
                f"{batch['steps_per_generation']} and be a multiple of gradient_accumulation_steps "
                f"{batch['gradient_accumulation_steps']} (whole optimizer updates)"
            )
        groups = generation_groups_problem(
            batch["per_device_train_batch_size"], len(ranks), batch["steps_per_generation"],
            batch["num_generations"],
        )  # fmt: skip
        if groups and n_agents > 1:
            problems.append(f"agent {name!r}: {groups}")  # what the launch would refuse, with its fix
        parts = {k: v / GIB for k, v in checkpoint_parts(d, trainable, lora, launch, load_bytes).items()}
        ckpt = sum(parts.values())
        tokens = forward_rows(batch) * seq
        act = 4 if launch.parallelism == "fsdp" and not lora else 2
        layer_gib = tokens * d.layer_bytes_per_token(act) / GIB
        grad_gib = 2 * trainable / n / GIB if launch.parallelism == "zero" and launch.zero_stage == 2 else 0.0
        err = error_bar(memory, layer_gib, grad_gib, colocate)
        if device_gib is not None and peak <= device_gib < peak + err[1]:
            notes.append(
                f"agent {name!r}: {peak:.1f} GiB fits {device_gib:.1f} GiB, but not at the top of the error bar "
                f"(+{err[1]:.1f} GiB); watch the first steps' peak reserved memory"
            )
        agents.append(
            AgentPlan(
                name,
                agent.spec.model_name_or_path or "",
                ranks,
                devices,
                d.params,
                trainable,
                batch,
                memory,
                peak,
                ckpt,
                vllm,
                err,
                parts,
                final_model_bytes(d, trainable, lora, launch, load_bytes) / GIB,
            )
        )
        schedules.append((batch["prompts_per_generation"], batch["updates_per_generation"]))

    if shared and device_gib is not None:
        _check_shared_gpus(agents, recipe, device_gib, problems, notes)
    if not on_cpu and not expandable_segments:
        notes.append(
            "the CUDA allocator runs without expandable segments (PYTORCH_CUDA_ALLOC_CONF says otherwise, or vLLM's "
            "sleep mode needs its memory pool): its reserved memory can be several times the allocation (71.8 GiB "
            f"reserved for 15.7 allocated, a 4B LoRA agent with transformers' generate), beyond the {FRAGMENTATION_GIB:g} "
            "GiB allowed here"
        )
    # each learner's own filter (it may differ per agent)
    for agent in resolved.agents:
        if (peer_filter := learners[agent.name].peer_filter) != "all":
            notes.append(
                f"agent {agent.name!r}: peer_filter {peer_filter!r}: its peer rows and rows per forward "
                "pass are upper bounds"
            )
    if len({s for s in schedules}) > 1:
        problems.append(f"agents differ in prompts or updates per generation batch: {schedules}")
    schedule = _schedule(recipe, agents[0].batch, dataset_rows, problems, notes)
    if n_agents > 1:
        schedule["sharing"] = describe_sharing(recipe)
    for a in agents:
        a.batch["checkpoint_disk_gib"] = a.checkpoint_gib * schedule.get("checkpoints_kept", 0)
        # HACPO prunes after each save, so one checkpoint more than the limit exists for a while; then the final model
        a.batch["peak_disk_gib"] = a.checkpoint_gib * schedule.get("checkpoints_on_disk_at_once", 0) + a.final_model_gib
    schedule["peak_disk_gib"] = sum(a.batch["peak_disk_gib"] for a in agents)
    return Plan(agents, launch, device_gib, schedule, problems, notes)


def _check_shared_gpus(
    agents: list[AgentPlan], recipe: dict, device_gib: float, problems: list[str], notes: list[str]
) -> None:
    """Agents that time-share a GPU (``share_gpus``) must fit it together: each process's peak, summed (the caching
    allocator keeps what a process reserved while the other runs). With colocated vLLM each engine asks, when it
    starts, for its ``vllm_gpu_memory_utilization`` of the whole device as free memory, next to what the other
    processes already hold; the plan says which share fits."""
    on: dict[str, list[tuple[AgentPlan, float]]] = {}
    for a in agents:
        for device in a.devices:
            on.setdefault(device, []).append((a, a.peak_gib))
    for device, held in on.items():
        if len(held) < 2:
            continue
        total = sum(p for _, p in held)
        names = ", ".join(f"{a.name} {p:.1f}" for a, p in held)
        if total > device_gib:
            problems.append(
                f"{device} is shared by {len(held)} processes (share_gpus) whose peaks add up to {total:.1f} GiB "
                f"({names}), more than its {device_gib:.1f} GiB"
            )
        else:
            notes.append(f"{device} is shared (share_gpus): {names} GiB, {total:.1f} of {device_gib:.1f} GiB together")
        engines = [(a, a.vllm["engine_gib"]) for a, _ in held if a.vllm.get("mode") == "colocate"]
        if engines:
            others = sum(sum(v for k, v in a.memory.items() if k not in PHASES) for a, _ in held)
            free = device_gib - others
            share = math.floor(100 * free / device_gib / len(engines)) / 100
            asked = sum(e for _, e in engines)
            if asked > free:
                problems.append(
                    f"{device}: the colocated vLLM engines of {', '.join(a.name for a, _ in engines)} ask for "
                    f"{asked:.1f} GiB together but about {free:.1f} GiB is left beside the processes' weights and "
                    f"optimizer states; give each vllm_gpu_memory_utilization <= {share:.2f} (vLLM refuses to start "
                    "when less memory is free than its share of the device)"
                )
            else:
                notes.append(
                    f"{device}: colocated vLLM engines {asked:.1f} GiB of the {free:.1f} GiB left beside the training "
                    f"states; each may take up to vllm_gpu_memory_utilization {share:.2f}"
                )


def _schedule(recipe: dict, batch: dict, dataset_rows: int | None, problems: list[str], notes: list[str]) -> dict:
    """Generation batches and optimizer steps per epoch, and the checkpoints written and kept."""
    prompts = batch["prompts_per_generation"]
    updates = batch["updates_per_generation"]
    out: dict[str, object] = {"dataset_rows": dataset_rows}
    if dataset_rows is not None and prompts:
        generations = int(dataset_rows // prompts)  # TRL's RepeatSampler drops the last partial generation batch
        out["generations_per_epoch"] = generations
        out["steps_per_epoch"] = int(generations * updates)
    max_steps = int(recipe.get("max_steps", -1) or -1)
    if max_steps > 0:
        out["total_steps"] = max_steps
    elif "steps_per_epoch" in out:
        out["total_steps"] = math.ceil(float(recipe.get("num_train_epochs", 3.0)) * out["steps_per_epoch"])
    else:
        notes.append("the dataset size is unknown here, so total steps and checkpoint counts are not computed")
    strategy = recipe.get("save_strategy", "steps")
    save_steps = recipe.get("save_steps", 500)
    cut = (batch["steps_per_generation"], batch["num_iterations"], batch["gradient_accumulation_steps"])
    if strategy == "steps" and save_steps:
        if float(save_steps) < 1:
            notes.append(f"save_steps {save_steps} is a fraction of the run; not checked against generation batches")
        elif ends_inside_batch(save_steps, *cut):  # as `HACPOConfig` refuses it
            problems.append(
                f"save_steps {save_steps} is not a multiple of the {updates:g} optimizer updates per generation "
                "batch, so checkpoints would land mid-generation and resume would run out of phase"
            )
        if max_steps > 0 and ends_inside_batch(max_steps, *cut):
            notes.append(
                f"max_steps {max_steps} ends inside a generation batch ({updates:g} updates each): the final "
                "checkpoint is mid-batch, so continuing from it would run out of phase"
            )
        if "total_steps" in out and float(save_steps) >= 1:
            total, every = int(out["total_steps"]), int(save_steps)
            written = total // every + (1 if total % every else 0)  # transformers also saves at the final step
            limit = recipe.get("save_total_limit")
            out["checkpoints_written"] = written
            out["checkpoints_kept"] = min(written, int(limit)) if limit else written
            out["checkpoints_on_disk_at_once"] = min(written, int(limit) + 1) if limit else written
            if not limit:
                notes.append("no save_total_limit: every checkpoint stays on disk")
    return out


# --------------------------------------------------------------------------------------------------- output


def _prompts(batch: dict) -> str:
    """Prompts per generation batch; a batch that holds no whole number of prompt groups says so instead."""
    prompts, g, n = batch["prompts_per_generation"], batch["num_generations"], batch["completions_per_generation"]
    if float(prompts).is_integer():
        return f"{prompts:g} prompts x {g} = {n} completions"
    return f"{n} completions, not whole prompt groups of {g} (PROBLEM below)"


def format_plan(plan: Plan) -> str:
    """The plan as text for a terminal."""
    lines = []
    device = "CPU (no device memory check)" if plan.device_gib is None else f"{plan.device_gib:.1f} GiB per GPU"
    lines.append(f"launch: {plan.launch.label} inside each agent ({plan.launch.source}); device: {device}")
    s = plan.schedule
    if "sharing" in s:
        lines.append(str(s["sharing"]))
    if "steps_per_epoch" in s:
        lines.append(
            f"schedule: {s['dataset_rows']} prompts -> {s['generations_per_epoch']} generation batches, "
            f"{s['steps_per_epoch']} optimizer steps per epoch; {s.get('total_steps')} steps in the run"
        )
    elif "total_steps" in s:
        lines.append(f"schedule: {s['total_steps']} optimizer steps (max_steps)")
    if "checkpoints_written" in s:
        lines.append(
            f"checkpoints: {s['checkpoints_written']} written (the final step included), {s['checkpoints_kept']} "
            f"kept; peak disk {s['peak_disk_gib']:.1f} GiB for all agents"
        )
    for a in plan.agents:
        b = a.batch
        lines.append("")
        lines.append(f"agent {a.name} ({a.model}): {a.params:,} parameters, {a.trainable:,} trained")
        lines.append(f"  global ranks {a.ranks[0]}-{a.ranks[-1]} on {', '.join(a.devices)}")
        lines.append(
            f"  generation batch: {_prompts(b)}; per rank {b['own_completions_per_rank']} own + "
            f"{b['peer_rows_per_rank']} peer rows"
        )
        mix = ", ".join(f"{u['own']} own + {u['peer']} peer" for u in b["rows_per_update"])
        if b.get("gspo_schedule"):
            own = b["own_completions_per_rank"] * len(a.ranks) * b["gradient_accumulation_steps"]
            own //= b["steps_per_generation"]
            lines.append(
                f"  {b['updates_per_generation']:g} optimizer updates per generation batch, as GSPO with this "
                f"recipe: {own} own rows each, none skipped; taught rows join them (up to the peer's rows above)"
            )
        else:
            lines.append(f"  {b['updates_per_generation']:g} optimizer updates per generation batch: {mix}")
        lines.append(f"  rows per forward pass: {b['rows_per_forward']}")
        if b.get("solo_steps_per_generation"):
            skipped = b["updates_per_generation"] - b["solo_updates"]
            lines.append(
                f"  learning from no one at a batch: {b['solo_updates']:g} optimizer updates of "
                f"{b['solo_rows_per_update']} own rows, {b['solo_rows_per_forward']} rows per forward pass; "
                f"{skipped:g} skipped (solo_steps_per_generation {b['solo_steps_per_generation']})"
            )
            if b.get("few_prompts_rows_per_forward"):
                lines.append(
                    "  with rescued or taught peer rows only (capability_gate_rescue, taught_schedule: solo): up to "
                    f"{b['few_prompts_rows_per_forward']} rows per forward pass"
                )
        lines.append("  memory per rank (GiB): " + ", ".join(f"{k} {v:.1f}" for k, v in a.memory.items() if v))
        budget = "" if plan.device_gib is None else f" of {plan.device_gib:.1f}"
        low, high = a.error_gib
        bar = f" (error bar -{low:.1f} / +{high:.1f} GiB: fragmentation, NCCL, backward transients)" if high else ""
        lines.append(f"  peak estimate: {a.peak_gib:.1f}{budget} GiB{bar}")
        if a.vllm:
            v = a.vllm
            where = "per rank, colocated" if v["mode"] == "colocate" else "on its server"
            sleep = "; sleep mode: released during the training passes" if v["sleep_mode"] else ""
            lines.append(
                f"  vLLM ({where}): {v['engine_gib']:.1f} GiB, max_model_len {v['max_model_len']:,}, KV cache "
                f"~{v['kv_cache_gib']:.1f} GiB = {v['kv_tokens']:,} tokens; one full-length request "
                f"{v['one_request_gib']:.2f} GiB; {v['concurrent_seqs']} full-length sequences at once of "
                f"{v['requests']} requests per generation batch{sleep}"
            )
        parts = " + ".join(f"{k} {v:.1f}" for k, v in a.checkpoint_parts.items())
        lines.append(
            f"  checkpoint: {a.checkpoint_gib:.1f} GiB each ({parts}), {b['checkpoint_disk_gib']:.1f} GiB kept; "
            f"peak disk {b['peak_disk_gib']:.1f} GiB (one extra checkpoint before pruning + final model "
            f"{a.final_model_gib:.1f})"
        )
    for note in plan.notes:
        lines.append(f"note: {note}")
    lines.append("")
    if plan.ok:
        lines.append("plan: OK (an estimate; see the README for what it does not check)")
    else:
        lines.extend(f"plan: PROBLEM: {p}" for p in plan.problems)
        lines.extend(f"plan: to fit, {f}" for f in plan.fixes)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ what to change when it does not fit


def device_loads(plan: Plan) -> dict[str, float]:
    """GiB each device holds at its peak: one rank's peak, or the sum of the ranks sharing it (``share_gpus``)."""
    loads: dict[str, float] = {}
    for a in plan.agents:
        for device in a.devices:
            loads[device] = loads.get(device, 0.0) + a.peak_gib
    return loads


def _fits(plan: Plan) -> bool:
    return plan.device_gib is None or all(v <= plan.device_gib for v in device_loads(plan).values())


def _agents_as_list(recipe: dict) -> list[dict]:
    agents = recipe.get("agents") or []
    if isinstance(agents, dict):
        return [{"name": name, **(spec or {})} for name, spec in agents.items()]
    return [dict(a) for a in agents]


def fixes(recipe: dict, plan: Plan, replan) -> list[str]:
    """For a plan whose devices do not hold their ranks' peaks: the nearest change of each kind that fits, each
    planned again with ``replan(recipe)`` and kept only if it fits and adds no problem: a smaller micro-batch (the
    same generation batch and optimizer updates, in more forward passes), a shorter ``max_completion_length``,
    LoRA for agents trained in full, a GPU per process instead of ``share_gpus``."""
    if _fits(plan):
        return []
    known = set(plan.problems)

    def tried(changed: dict) -> Plan | None:
        try:
            candidate = replan({**recipe, **changed})
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            return None
        return candidate if _fits(candidate) and set(candidate.problems) <= known else None

    def peak(candidate: Plan) -> str:
        return f"{max(device_loads(candidate).values()):.1f} of {candidate.device_gib:.1f} GiB on the fullest GPU"

    out = []
    b = plan.agents[0].batch
    per_device, steps, ga = (
        b["per_device_train_batch_size"],
        b["steps_per_generation"],
        b["gradient_accumulation_steps"],
    )
    solo = recipe.get("solo_steps_per_generation")
    factor = 2
    while per_device % factor == 0:
        olds = {
            "per_device_train_batch_size": per_device,
            "steps_per_generation": steps,
            "gradient_accumulation_steps": ga,
        }
        news = {"per_device_train_batch_size": per_device // factor, "steps_per_generation": steps * factor,
                "gradient_accumulation_steps": ga * factor}  # fmt: skip
        if solo:
            olds["solo_steps_per_generation"], news["solo_steps_per_generation"] = int(solo), int(solo) * factor
        if (candidate := tried(news)) is not None:
            said = ", ".join(f"{k} {olds[k]} -> {v}" for k, v in news.items())
            out.append(f"{said} (the same generation batch and updates, smaller forward passes): {peak(candidate)}")
            break
        factor *= 2
    length = int(recipe.get("max_completion_length", 512))
    step = 64 if length <= 2048 else 256
    for shorter in range((length - 1) // step * step, 0, -step):
        changed = {"max_completion_length": shorter}
        if recipe.get("vllm_max_model_length"):
            changed["vllm_max_model_length"] = int(recipe["vllm_max_model_length"]) - (length - shorter)
        if (candidate := tried(changed)) is not None:
            out.append(f"max_completion_length {length} -> {shorter}: {peak(candidate)}")
            break
    agents = _agents_as_list(recipe)
    full = [a["name"] for a in agents if a.get("lora") is None]
    if full:
        lora = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
        changed = {"agents": [{**a, "lora": lora} if a["name"] in full else a for a in agents]}
        if (candidate := tried(changed)) is not None:
            out.append(f"LoRA for {', '.join(map(repr, full))} (lora: {{r: 16, target_modules: all-linear}}): "
                       f"{peak(candidate)}")  # fmt: skip
    if recipe.get("share_gpus"):
        if (candidate := tried({"share_gpus": False})) is not None:
            count = sum(len(a.ranks) for a in plan.agents)
            out.append(f"a GPU per process (share_gpus: false, {count} GPUs): {peak(candidate)}")
    return out
