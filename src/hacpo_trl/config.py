"""`HACPOConfig`: TRL's `GRPOConfig` plus the agents of a run and HACPO's hyperparameters and switches."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from .algorithm import PEER_LAYOUTS, CapabilityTracker, HACPOLossConfig
from .generation.vllm_servers import check_vllm_servers
from .run.placement import launch_engine, share_gpus
from .run.resolve import AgentSpec, ResolvedAgent, agent_output_dir, resolve
from .run.schedule import ends_inside_batch, generation_groups_problem, solo_fits, update_schedule_problem
from .run.topology import AgentTopology, current_topology, init_agent_worlds
from .sharing.presets import PRESET_SETTINGS, expand_sharing
from .sharing.settings import RUN_WIDE_SETTINGS, SharingFields, SharingSettings, parse_learn_from

__all__ = ["AgentSpec", "HACPOConfig", "agent_output_dir"]  # AgentSpec: see `hacpo_trl.run.resolve`

# TRL's losses whose row weights do not depend on the micro-batch's other rows (row count fixed, or a global token count)
LENGTH_GROUPABLE_LOSSES = ("grpo", "dr_grpo", "dapo", "cispo", "sapo")

# Settings that must be equal for every agent: peer log-probs are only comparable under the same sampling
# distribution, and every agent must reach every exchange the same number of times with the same prompts.
SHARED_SETTINGS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "num_generations",
    "generation_batch_size",
    "steps_per_generation",
    "num_iterations",
    "max_steps",
    "num_train_epochs",
    "seed",
    "data_seed",
    "shuffle_dataset",
    "max_completion_length",
    "mask_truncated_completions",  # every learner must mask the same peers' unfinished completions
    # every agent exchanges at every generation batch; whom and what each learns from is its own choice
    # (`sharing.LEARNER_SETTINGS`), so those may differ
    *RUN_WIDE_SETTINGS,
    "save_strategy",  # agents checkpoint together, so that resuming finds a step every agent saved
    "save_steps",
    "gradient_accumulation_steps",  # save_steps and max_steps count optimizer steps: equal GA keeps agents in step
)


@dataclass
class HACPOConfig(SharingFields, GRPOConfig):
    r"""
    Configuration for [`HACPOTrainer`]: every [`~trl.GRPOConfig`] argument, plus the agents and HACPO's settings.

    One config describes the whole run; each process resolves it to *its* agent when the config is created (which is
    also when the launch is split into one world per agent, see `hacpo_trl.run.topology`), so create it before anything
    else that touches accelerate. Defaults follow the paper and the official implementation; the loss replaces
    `loss_type` (HACPO aggregates per sequence, like `loss_type="grpo"` with `importance_sampling_level="sequence"`).

    Parameters:
        > Agents

        agents (`list[AgentSpec | dict]` or `dict[str, dict]`, *optional*):
            The agents trained together, in launch order (global ranks go to agents in this order). `None` means a
            single agent named `"policy"` on every process, i.e. plain GSPO with HACPO's loss code.
        agent_name (`str`, set automatically):
            The agent this process trains. Read-only.

        > Collaboration

        sharing (`str`, *optional*, defaults to `"paper"`):
            A named sharing mode, expanded (:mod:`hacpo_trl.sharing.presets`) into the settings below that the recipe leaves
            out; a setting given beside it wins. `"paper"`: the paper's rule (every peer row, in the band; each
            setting's default). `"recommended"`: `peer_filter: correct`, `peer_prompts: failed`,
            `taught_failed_rate: 0.125`, `taught_ratio_floor: 0.2`, `taught_schedule: solo`, `taught_cap: 3`,
            `band_gate: true`; every batch is cut as GSPO cuts the recipe's (no update skipped), taught rows joining
            its updates, so a GSPO recipe plus this line makes GSPO's optimizer steps. `"none"`:
            `share_rollouts: false` (GSPO). The library's default is the paper's rule, as in the paper; every shipped
            recipe names its mode, and a run's first lines say which it trains with. The settings the benchmark
            screened and did not adopt are the benchmark's (`benchmarks/reproduce.py`). `--plan`, `hacpo-probe`, the
            model card and `hacpo_summary.json` name the mode and its settings. The run's, not per agent.
        share_rollouts (`bool`, *optional*, defaults to `True`):
            Share completions between agents. `False` trains every agent independently with TRL's own loss (so
            `loss_type` / `importance_sampling_level` pick GRPO, GSPO, ...: the paper's baselines) while keeping the
            launch, capability logging and saving identical.
        Each learner's sharing settings: the fields of :class:`~hacpo_trl.sharing.settings.SharingFields`, documented there.
        share_gpus (`bool`, *optional*, defaults to `False`):
            Let the agents' processes time-share GPUs on purpose: the node's i-th process gets GPU i mod (GPUs
            listed), so two one-process agents on one GPU both use it (generation and training take turns). An
            agent's own processes still need one GPU each. Without it, two processes on one GPU are refused as a
            mistake. A setting of the whole launch, not per agent; `hacpo-train --plan` sums the agents of each GPU.
        exchange_timeout (`float`, *optional*, defaults to `1800`):
            Seconds a process waits in an exchange for every process of every agent to arrive, once training runs,
            before failing with an error naming the absent ones. Agents exchange once per generation batch, so the
            faster agent waits there for the slower one's whole generate + score + train cycle: the wait is the
            agents' step-time gap (minutes for a 4B model with 4k-token completions), and the bound must exceed
            it, and the slowest agent's checkpoint write. A hang is reported after this long.
        exchange_startup_timeout (`float`, *optional*, defaults to `3600`):
            The same bound for the exchanges until the first step is done (start-up settings, resume, the first
            rollouts), which also wait for the slowest agent's model download, vLLM start-up and first generation.

        > Capability (Eqs. 8-9)

        capability_window (`int`, *optional*, defaults to `5`):
            K: number of recent steps averaged into each agent's capability P̂.
        capability_metric (`str`, *optional*, defaults to `"accuracy"`):
            `"accuracy"` (fraction of completions with reward > 0) or `"mean_reward"` (for non-binary rewards).
        capability_ratio_min / capability_ratio_max (`float`, *optional*, defaults to `0.1` / `10.0`):
            Clamp of ω = P̂_a / P̂_b.

        > Advantage (Eqs. 5-7)

        capability_baseline (`bool`, *optional*, defaults to `True`):
            Scale peer rewards by ω(k, j) in the learner's baseline. `False`: plain joint mean (ablation).
        zero_uniform_groups (`bool`, *optional*, defaults to `True`):
            A joint group whose rewards are all equal gets advantage 0.
        max_reward (`float` or `None`, *optional*, defaults to `1.0`):
            If a baseline exceeds this, use the learner's own mean instead. `None` disables the guard.

        > Loss (Eqs. 10-14)

        epsilon / epsilon_high (`float`, *optional*, defaults to `3e-4` / `4e-4`):
            GSPO clip range of self rows (the paper's values; TRL's own defaults are for token-level GRPO).
        alpha (`float`, *optional*, defaults to `1.0`):
            Exponent of the stop-gradient reweighting of peer rows. `0` disables it.
        peer_delta (`float`, *optional*, defaults to `0.2`):
            δ: the peer ratio band starts at [1 - δ, 1]. (The paper's Table 5 lists the bound 1 - δ as "δ".) Not
            named `delta`: `GRPOConfig.delta` is TRL's unrelated two-sided clip of the ratio.
        peer_delta_step (`float`, *optional*, defaults to `0.025`):
            The band's lower bound rises by this much per optimizer update on a generation batch. `0`: fixed bound.
        capability_coefficient (`bool`, *optional*, defaults to `True`):
            Multiply peer objectives by ω(j, k). `False`: 1 (ablation).
        peer_clipping (`bool`, *optional*, defaults to `True`):
            Clamp peer ratios into the band. `False`: no clipping (ablation).
        naive (`bool`, *optional*, defaults to `False`):
            The paper's "Naive" baseline: peer rows are treated like self rows (GSPO clip, no ω, no α, no band)
            and the baseline is the plain joint mean.
        ratio_mode (`str`, *optional*, defaults to `"mean"`):
            `"mean"`: per-token mean log-prob on each side's own tokenization (official). `"sum"`: whole-sequence
            log-likelihoods (not in the paper).
        max_abs_log_ratio (`float`, *optional*, defaults to `10.0`):
            Clamp of the log sequence ratio before `exp`.
        peer_layout (`str`, *optional*, defaults to `"self_first"`):
            Which updates of a generation batch hold the peer rows, and so which bounds lb_m they see. `"self_first"`:
            self rows fill the first updates and peer rows the last (the paper's text, the official v1's intent, and
            v1 on one GPU: with 4 updates peers see lb 0.85 and 0.875). `"interleaved"`: every update holds an equal
            share of self and peer rows, so peers see every bound (what v1 does as launched on 8 GPUs, the runs
            behind the paper's numbers; see `hacpo_trl.algorithm.peer_row_order`).
        skip_clipped_peer_backward (`bool`, *optional*, defaults to `True`):
            Score each mini-batch's peer rows in a forward pass without gradient first, and run forward + backward
            only on the rows that can have a gradient: peer rows outside the band cost one cheap forward instead
            of a backward. The loss and its gradient are unchanged (up to float rounding).
        trim_padding (`bool`, *optional*, defaults to `True`):
            Run every forward (TRL's old-log-prob and reference passes, HACPO's peer scoring and training passes) at
            its own rows' width: the leading and trailing columns that are padding in every row of a chunk are left
            out, and the no-gradient passes over a generation batch chunk rows of similar length together. Same
            log-probs and gradients (up to float rounding): a model without rotary embeddings keeps its left padding
            (its positions may be absolute), and one whose rotary frequencies follow the forward's length (`dynamic`,
            `longrope`) keeps TRL's padded forwards (`hacpo_trl.run.padding.trim_sides`). `False`: TRL's padded forwards
            for every model. `hacpo/time/padding_ratio/*` logs the waste either way.
        group_by_length (`bool`, *optional*, defaults to `False`):
            Put rows of similar length into the same training micro-batch, so that trimmed forwards carry little
            padding with long-tailed lengths. Rows move only between the micro-batches of one optimizer update and
            only for rows of equal weight in the loss, so each update sums the same rows with the same weights (same
            gradient up to float rounding); per-micro-batch metrics are averaged over other row groupings. Refused
            where the weights depend on the micro-batch (TRL's `bnpo`/`luspo`/`vespo` losses, `top_entropy_quantile`,
            TRL's entropy bonus).
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["agents"]

    agents: dict | str | None = field(
        default=None,
        metadata={"help": "The agents: a list of agent settings or a mapping name -> settings (JSON on the CLI)."},
    )
    agent_name: str | None = field(default=None, metadata={"help": "Set automatically: this process's agent."})

    sharing: str | None = field(
        default=None,
        metadata={"help": "Sharing mode: paper, none, recommended, ... (docs/settings.md); settings beside it win."},
    )
    share_rollouts: bool | None = field(default=None, metadata={"help": "Share completions between agents."})
    share_gpus: bool = field(
        default=False, metadata={"help": "Let the agents' processes time-share GPUs (e.g. two agents on one GPU)."}
    )
    exchange_timeout: float = field(default=1800.0, metadata={"help": "Seconds to wait on other agents."})
    exchange_startup_timeout: float = field(
        default=3600.0, metadata={"help": "Seconds to wait on other agents until the first step is done."}
    )

    capability_window: int = field(default=5, metadata={"help": "K, steps averaged into capability."})
    capability_metric: str = field(default="accuracy", metadata={"help": "'accuracy' or 'mean_reward'."})
    capability_ratio_min: float = field(default=0.1, metadata={"help": "Lower clamp of capability ratios."})
    capability_ratio_max: float = field(default=10.0, metadata={"help": "Upper clamp of capability ratios."})

    capability_baseline: bool = field(default=True, metadata={"help": "Capability-aware baseline."})
    zero_uniform_groups: bool = field(default=True, metadata={"help": "Zero advantage for uniform groups."})
    max_reward: float | None = field(default=1.0, metadata={"help": "Baseline guard; null disables."})

    epsilon: float = field(default=3e-4, metadata={"help": "Lower GSPO clip of self rows."})
    epsilon_high: float | None = field(default=4e-4, metadata={"help": "Upper GSPO clip of self rows."})
    importance_sampling_level: str = field(default="sequence", metadata={"help": "HACPO is sequence-level."})
    loss_type: str = field(default="grpo", metadata={"help": "HACPO aggregates per sequence, like 'grpo'."})
    alpha: float = field(default=1.0, metadata={"help": "Exponent of peer reweighting; 0 disables."})
    peer_delta: float = field(default=0.2, metadata={"help": "δ: the peer band starts at [1 - δ, 1]."})
    peer_delta_step: float = field(default=0.025, metadata={"help": "Band tightening per optimizer update."})
    capability_coefficient: bool = field(default=True, metadata={"help": "ω(j,k) in the peer loss."})
    peer_clipping: bool = field(default=True, metadata={"help": "Clamp peer ratios into the band."})
    naive: bool = field(default=False, metadata={"help": "Naive sharing baseline."})
    ratio_mode: str = field(default="mean", metadata={"help": "'mean' or 'sum' sequence log-probs."})
    max_abs_log_ratio: float = field(default=10.0, metadata={"help": "Clamp of log ratios."})
    skip_clipped_peer_backward: bool = field(
        default=True, metadata={"help": "Score peer rows without gradient first; no backward for clipped ones."}
    )
    peer_layout: str = field(default="self_first", metadata={"help": "'self_first' or 'interleaved' peer rows."})
    trim_padding: bool = field(default=True, metadata={"help": "Run each forward at its own rows' width."})
    group_by_length: bool = field(
        default=False, metadata={"help": "Rows of similar length share a training micro-batch, within each update."}
    )

    def __post_init__(self):
        # the sharing mode first: every check below, and each agent's overrides, see its settings
        self.__dict__.update(expand_sharing({k: getattr(self, k) for k in ("sharing", *PRESET_SETTINGS)}))
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        implicit = AgentSpec(name="policy", num_processes=world) if self.agents is None else None
        # every agent's settings, checked here by every process, so that all stop with the same error (not kept on
        # the config: its read-only mappings do not pickle, and the Trainer saves the arguments with torch.save)
        resolved = resolve(vars(self), fields={f.name for f in dataclasses.fields(self)}, default=implicit)
        self._specs = [a.spec for a in resolved.agents] if self.agents is not None else None
        if self.push_to_hub and self._specs and len(self._specs) > 1:
            missing = [s.name for s in self._specs if not s.hub_model_id]
            if missing:
                raise ValueError(
                    f"`push_to_hub` needs a `hub_model_id` for every agent (each is pushed to its own repository); "
                    f"missing for {missing}"
                )
        if self._specs and len(self._specs) > 1 and getattr(self.save_strategy, "value", self.save_strategy) == "best":
            raise ValueError(
                "`save_strategy: best` lets each agent decide alone when to checkpoint (on its own metric), but the "
                "agents of a run checkpoint together, at steps every agent saved; use `save_strategy: steps`"
            )
        names = resolved.names
        parse_learn_from(self.learn_from, names)
        # every agent's choice, checked by every process, so that every process stops alike
        for agent in resolved.agents if self._specs else []:
            spec = agent.spec
            for where in ("learn_from", "overrides.learn_from"):
                value = spec.learn_from if where == "learn_from" else spec.overrides.get("learn_from")
                parse_learn_from(value, names, f"agent {spec.name!r}: `{where}`")
            SharingSettings.from_values(agent.settings, f"agent {spec.name!r}: ")
        if self.importance_sampling_level != "sequence" and self.share_rollouts:
            raise ValueError(
                "HACPO's ratio is sequence-level: `importance_sampling_level` must be 'sequence' (other levels only "
                "with `share_rollouts: false`, where each agent trains with TRL's own loss)"
            )
        for name in ("exchange_timeout", "exchange_startup_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}")
        if self.group_by_length and not self.share_rollouts:
            entropy_bonus = bool(self.entropy_coef or self.use_adaptive_entropy)  # a token mean per micro-batch
            if self.loss_type not in LENGTH_GROUPABLE_LOSSES or self.top_entropy_quantile < 1.0 or entropy_bonus:
                raise ValueError(
                    f"`group_by_length` with loss_type={self.loss_type!r}, top_entropy_quantile="
                    f"{self.top_entropy_quantile} and entropy_coef={self.entropy_coef} (use_adaptive_entropy="
                    f"{self.use_adaptive_entropy}): the loss would weigh rows by what else is in their micro-batch, "
                    f"so regrouping would change the update. Use one of {LENGTH_GROUPABLE_LOSSES}, "
                    "top_entropy_quantile 1 and no entropy bonus, or group_by_length false."
                )
        if self.peer_layout not in PEER_LAYOUTS:
            raise ValueError(f"`peer_layout` must be one of {PEER_LAYOUTS}, got {self.peer_layout!r}")
        self.loss_config()  # validates alpha, peer_delta, peer_delta_step, epsilons, ratio_mode, beta
        CapabilityTracker(["x"], window=self.capability_window, metric=self.capability_metric)  # validates

        if resolved.several:
            check_vllm_servers(resolved)
        specs = [a.spec for a in resolved.agents]
        topology: AgentTopology = init_agent_worlds(
            [(s.name, s.num_processes) for s in specs],
            timeout_seconds=self.exchange_timeout,
            startup_timeout_seconds=self.exchange_startup_timeout,
            backend=self.ddp_backend,  # the agent world is made here, so accelerate's own choice never runs
            agent_timeout_seconds=self.ddp_timeout,
            use_cpu=self.use_cpu,
            share_gpus=share_gpus({"share_gpus": self.share_gpus}),
        )
        agent = resolved.agent(topology.agent)
        self.agent_spec = agent.spec
        self.agent_name = agent.name
        self._apply_agent(agent, several=resolved.several)
        self.learn_from = self._canonical_learn_from([s.name for s in specs])
        self.sharing_settings()  # this agent's, as applied
        # before TRL loads DeepSpeed
        if self.skip_empty_updates and launch_engine(self) == "DeepSpeed":
            raise ValueError(
                "`skip_empty_updates` does not work with DeepSpeed: its optimizer step runs inside the backward call, "
                "before HACPO knows whether the update had a row with a gradient; set it false or train with DDP / FSDP"
            )
        try:
            super().__post_init__()
        except ValueError:  # TRL's check that the batch holds whole prompt groups, told with the values that fit
            steps = self.steps_per_generation  # None when TRL stopped before deriving it: another problem
            groups = steps and generation_groups_problem(
                self.per_device_train_batch_size, self.world_size, steps, self.num_generations
            )
            if groups:
                raise ValueError(groups) from None
            raise
        if self.share_rollouts:
            self._reject_settings_hacpo_ignores()
        if len(specs) > 1:  # what every agent must agree on is compared by the trainer: agree_with_other_agents
            self._check_whole_prompt_groups()
            self._check_update_schedule()
        self._check_solo_schedule()
        self._check_save_steps()  # after the schedule check: a straddling schedule is the error to report first
        if self.naive:
            self.capability_baseline = False
        self.agents = {s.name: dataclasses.asdict(s) for s in specs} if self._specs else None

    def _apply_agent(self, agent: ResolvedAgent, several: bool) -> None:
        """This process's agent: what it sets over the run's settings (checked by `hacpo_trl.run.resolve`)."""
        for key, value in agent.own_settings.items():
            setattr(self, key, value)
        if several and self.run_name in (None, self.output_dir):
            self.run_name = agent.name

    def _check_solo_schedule(self) -> None:
        """`solo_steps_per_generation` must cut the generation batch into whole optimizer updates, so that the
        skipped micro-batches are whole updates (an update half-skipped would step on half its rows)."""
        solo, steps, ga = self.solo_steps_per_generation, self.steps_per_generation, self.gradient_accumulation_steps
        if solo is None:
            return
        if isinstance(solo, bool) or not isinstance(solo, int) or solo < 1 or not solo_fits(solo, steps, ga):
            raise ValueError(
                f"`solo_steps_per_generation` must be an integer >= 1 that divides `steps_per_generation` ({steps}) "
                f"and is a multiple of `gradient_accumulation_steps` ({ga}), got {solo!r}"
            )

    def _canonical_learn_from(self, agent_names: list[str]) -> str:
        """This agent's `learn_from` as ``"all"``, ``"none"`` or ``"a,b"`` (a YAML list becomes a string), checked."""
        names = parse_learn_from(self.learn_from, agent_names)
        if names is None:
            return "all"
        names = [n for n in names if n != self.agent_name]
        return ",".join(names) if names else "none"

    def learn_from_agents(self) -> list[str] | None:
        """The agents this learner may learn from (``None``: all of them)."""
        return parse_learn_from(self.learn_from, [s.name for s in self.specs])

    def _check_save_steps(self) -> None:
        """Checkpoints only between generation batches: TRL does not save its position inside a generation batch,
        so a mid-batch checkpoint resumes out of phase (the half-trained batch is regenerated and trained again).
        With `save_strategy: steps` the Trainer also saves at `max_steps` (a warning: only continuing from that
        checkpoint goes out of phase, and a short trial run is common)."""
        if self.save_strategy != "steps" or self.save_steps < 1:
            return
        schedule = (self.steps_per_generation, self.num_iterations, self.gradient_accumulation_steps)
        updates = self.steps_per_generation * self.num_iterations / self.gradient_accumulation_steps
        if ends_inside_batch(self.save_steps, *schedule):
            raise ValueError(
                f"`save_steps` = {self.save_steps} would checkpoint in the middle of a generation batch: a generation "
                f"batch lasts {updates:g} optimizer updates (steps_per_generation x num_iterations / "
                "gradient_accumulation_steps), and a run resumed from such a checkpoint trains out of phase. Use a "
                "multiple of it"
            )
        if self.max_steps > 0 and ends_inside_batch(self.max_steps, *schedule):
            # only resuming that last checkpoint to train further goes wrong, so a short trial run stays allowed
            warnings.warn(
                f"`max_steps` = {self.max_steps} ends in the middle of a generation batch ({updates:g} optimizer "
                "updates each), and the Trainer checkpoints at the last step: resuming from that checkpoint to train "
                "further would run out of phase. Use a multiple of it for a run you mean to continue",
                stacklevel=2,
            )

    def _reject_settings_hacpo_ignores(self) -> None:
        """With sharing, HACPO's loss and advantages replace TRL's: TRL settings that only act there would be
        silently ignored, so they are refused (`share_rollouts: false` keeps TRL's own loss, where they work)."""
        ignored = []
        if self.loss_type != "grpo":
            ignored.append(f"loss_type={self.loss_type!r} (HACPO aggregates per sequence, like 'grpo')")
        if self.entropy_coef or self.use_adaptive_entropy:
            ignored.append("entropy_coef / use_adaptive_entropy (HACPO's loss has no entropy bonus)")
        if self.delta is not None:
            ignored.append(f"delta={self.delta!r} (TRL's two-sided ratio clip; HACPO's peer band is `peer_delta`)")
        if self.scale_rewards != "group":
            ignored.append(
                f"scale_rewards={self.scale_rewards!r} (HACPO's advantages divide by the std of each joint group)"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            ignored.append(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} (HACPO sums the weighted rewards, "
                "then normalizes over the joint group)"
            )
        if self.router_aux_loss_coef:
            ignored.append(
                f"router_aux_loss_coef={self.router_aux_loss_coef!r} (the MoE load-balancing loss is not added)"
            )
        if ignored:
            raise ValueError(
                "HACPO's loss (share_rollouts=True) would silently ignore: "
                + "; ".join(ignored)
                + ". Remove these settings, or set `share_rollouts: false` to train every agent with TRL's own loss."
            )

    def _check_update_schedule(self) -> None:
        """The stepwise peer bound counts the optimizer updates made on a generation batch, m = (micro-step mod
        S·I) // GA, with S = steps_per_generation and I = num_iterations. That is exact only if every update lies
        inside one generation batch (S·I a multiple of GA) or spans whole ones (GA a multiple of S·I: m = 0)."""
        steps, iterations, ga = self.steps_per_generation, self.num_iterations, self.gradient_accumulation_steps
        problem = update_schedule_problem(steps, iterations, ga) if self.share_rollouts else None
        if problem:
            raise ValueError(problem)

    def _check_whole_prompt_groups(self) -> None:
        """Each process must hold whole prompt groups, to match them with its peers' completions."""
        local_generation = self.per_device_train_batch_size * self.steps_per_generation
        if self.share_rollouts and local_generation % self.num_generations:
            raise ValueError(
                f"agent {self.agent_name!r}: per_device_train_batch_size x steps_per_generation = {local_generation} "
                f"must be a multiple of num_generations = {self.num_generations}, so that each process holds whole "
                "prompt groups to match with its peers' completions"
            )

    def agree_with_other_agents(self) -> None:
        """Every agent must sample and schedule identically (peer log-probs and exchanges only match then), save to
        its own folder, and share one run group (wandb), chosen by global rank 0. Compared over the exchange, a
        collective of the whole launch: `HACPOTrainer` calls it on every process, before it loads the model; a
        config alone makes no exchange and writes no environment variable. A single agent has nothing to agree on."""
        import time

        from .run.exchange import Exchange

        topology = current_topology()
        if len(self.specs) < 2 or topology is None:
            return
        run = os.path.basename(os.path.normpath(os.path.dirname(self.output_dir) or ".")) or "hacpo"
        group = os.environ.get("WANDB_RUN_GROUP") or f"{run}-{time.strftime('%Y%m%d-%H%M%S')}"
        mine = self.shared_settings()
        everyone = Exchange(topology).all_gather(
            (self.agent_name, topology.global_rank, mine, group, os.path.abspath(self.output_dir)),
            what="start-up settings",
        )
        for agent, rank, theirs, _, _ in everyone:
            for key in SHARED_SETTINGS:
                if theirs.get(key) != mine.get(key):
                    raise ValueError(
                        f"`{key}` must be equal for every agent, but agent {self.agent_name!r} has {mine.get(key)!r} "
                        f"and agent {agent!r} (global rank {rank}) has {theirs.get(key)!r}. Set it once for the run, "
                        "not per agent (for batch sizes: per_device_train_batch_size x num_processes x "
                        "steps_per_generation must give the same generation batch)."
                    )
        outputs = {}
        for agent, _, _, _, output in everyone:
            if outputs.setdefault(output, agent) != agent:
                raise ValueError(
                    f"agents {outputs[output]!r} and {agent!r} share the output_dir {output!r}; give each its own"
                )
        os.environ["WANDB_RUN_GROUP"] = everyone[0][3]

    @property
    def specs(self) -> list[AgentSpec]:
        """Every agent of the run (the implicit single agent when `agents` is not set)."""
        return self._specs or [self.agent_spec]

    def shared_settings(self) -> dict:
        return {k: getattr(self, k, None) for k in SHARED_SETTINGS}

    def sharing_settings(self) -> SharingSettings:
        """This agent's sharing options, checked (:class:`~hacpo_trl.sharing.settings.SharingSettings`)."""
        return SharingSettings.from_values(vars(self))

    def loss_config(self) -> HACPOLossConfig:
        return HACPOLossConfig(
            epsilon_low=self.epsilon,
            epsilon_high=self.epsilon_high if self.epsilon_high is not None else self.epsilon,
            delta=self.peer_delta,
            delta_step=self.peer_delta_step,
            alpha=self.alpha,
            capability_coefficient=self.capability_coefficient,
            peer_clipping=self.peer_clipping,
            naive=self.naive,
            ratio_mode=self.ratio_mode,
            max_abs_log_ratio=self.max_abs_log_ratio,
            beta=self.beta,
            kl_bias_correction=self.use_bias_correction_kl,
        )
