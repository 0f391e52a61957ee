"""`HACPOTrainer`: TRL's `GRPOTrainer` for one agent of a HACPO run, sharing rollouts with the other agents.

Each agent runs it in its own accelerate world (:mod:`hacpo_trl.run.topology`); what TRL does stays TRL's. This module
is the glue: TRL's hooks, every forward pass and every collective over an agent's ranks. The logic is in `sharing`
(decision, peer rows, peer loss), `run` (schedule, updates, padding, checkpoints), `training` (loading, metrics, the
model card) and `generation` (the vLLM engine), tested without a trainer. With ``share_rollouts=False`` the loss is
TRL's own: exactly TRL's GRPO / GSPO.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from contextlib import contextmanager

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from .algorithm import CapabilityTracker
from .config import HACPOConfig
from .generation import engine
from .run import checkpoints, exchange, padding, schedule, updates
from .run.exchange import PROMPT_ID_COLUMN, RolloutBatch
from .run.topology import current_topology
from .sharing import peer_loss, peer_rows
from .sharing.decision import PeerDecision, decide
from .sharing.retokenize import completion_text
from .tasks.rewards import guard_rewards, no_reward_warning
from .training import loading, metrics
from .training.model_card import PAPER, complete_card, hub_base_model

__all__ = ["HACPOTrainer", "PROMPT_ID_COLUMN"]


class HACPOTrainer(GRPOTrainer):
    """Train one agent of a HACPO run; every process of the launch builds one, for its own agent.

    Args:
        model: the agent's model (path or instance); default: ``args.agent_spec.model_name_or_path``.
        reward_funcs: as for `GRPOTrainer`; every agent should use the same ones (peers share rewards).
        args: a [`HACPOConfig`], created before anything else touches accelerate.
        train_dataset: the same dataset for every agent (prompts are matched by id each step).
        processing_class: the agent's tokenizer; default: loaded from the agent's tokenizer or model path.
        peft_config: LoRA for this agent; default: built from ``args.agent_spec.lora`` when set.
        **kwargs: passed to `GRPOTrainer`.
    """

    _tag_names = ["trl", "hacpo"]
    _name = "HACPO"
    _paper = PAPER

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: HACPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        peft_config=None,
        **kwargs,
    ):
        agent = loading.prepare_agent(args, kwargs, model, processing_class, peft_config)
        model, self._base_model, processing_class, peft_config = agent
        args.agree_with_other_agents()  # a collective of the whole launch, before any model loads
        engine.before_build(args, model, loading.load_dtype)  # each agent's vLLM engine: its seeds, the CPU build
        train_dataset, eval_dataset = exchange.with_prompt_ids(train_dataset), exchange.with_prompt_ids(eval_dataset)
        kwargs.update(train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=processing_class)
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, peft_config=peft_config, **kwargs)
        # rewards get the dataset's columns, as in held-out evaluation; one that raises is named in one line
        self.reward_funcs = guard_rewards(self.reward_funcs, "training", hidden=(PROMPT_ID_COLUMN,))
        engine.after_build(self)
        self.agent, self.agent_names = args.agent_spec.name, [s.name for s in args.specs]
        if args.share_rollouts and self.aux_loss_enabled:
            raise ValueError(loading.moe_loss_message(self.agent, type(self.model).__name__, self.router_aux_loss_coef))
        self.topology = current_topology()
        self.exchange = exchange.Exchange(self.topology)
        self.capability = CapabilityTracker(self.agent_names, args.capability_window, metric=args.capability_metric)
        self.hacpo_loss_config, self.sharing = args.loss_config(), args.sharing_settings()
        self._captured, self._prepare_seconds, self._warned_no_reward = {}, 0.0, False
        self._forward_pass, self._generation_forwards = "other", 0
        self._padding_sums: dict[str, dict[str, list[float]]] = {"train": {}, "eval": {}}
        self._trim_sides = padding.trim_sides(self.model.config)  # before any wrapping: which padding may go
        self._updates = schedule.UpdateState()  # what the update under way gathers
        # public (callbacks, `hacpo-probe`): every agent's records of the last generation batch, the peer rows taken
        self.last_records: list[RolloutBatch] = []
        self.last_peer_rows: peer_rows.PeerRows | None = None
        self.last_decision: PeerDecision | None = None  # before the band gate
        self.add_callback(metrics.OptimizerTimer(self))
        self.add_callback(updates.ResumeGradScaler(self._updates))
        self._self_on_policy = self._one_update(args.steps_per_generation)
        # how the buffered generation batch is trained, set with each one; before the first: skip nothing
        self._plan: schedule.BatchPlan = self._plan_for(0, peers=True, few_prompts=False)

    def _one_update(self, steps: int) -> bool:
        """Whether ``steps`` micro-batches per generation batch make one update: TRL then computes no old log-probs."""
        vllm_weights = self.use_vllm and self.vllm_importance_sampling_correction
        return schedule.self_on_policy(self.args.gradient_accumulation_steps, steps * self.num_iterations, vllm_weights)

    @property
    def _generate_every(self) -> int:
        """Micro-batches per generation batch (`steps_per_generation` × `num_iterations`), as `_step` counts them."""
        return self.args.steps_per_generation * self.num_iterations

    def _solo_steps(self) -> int:
        """Micro-batches of a generation batch of own rows only (:func:`hacpo_trl.run.schedule.solo_steps`)."""
        sharing = self.args.share_rollouts and len(self.agent_names) > 1 and self.model.training
        return schedule.solo_steps(self.args.steps_per_generation, self.args.solo_steps_per_generation, sharing)

    def _plan_for(self, own_rows: int, peers: bool, few_prompts: bool) -> schedule.BatchPlan:
        steps, solo = self.args.steps_per_generation, self._solo_steps()
        return schedule.plan_batch(own_rows, peers, few_prompts, steps, solo, self.num_iterations)

    def _log(self, mode: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[mode][key].append(value)

    @contextmanager
    def _timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self._metrics["train" if self.model.training else "eval"][f"hacpo/time/{name}"].append(elapsed)
            if name == "prepare_inputs":
                self._prepare_seconds += elapsed

    def _generate(self, prompts):
        with self._timed("generate"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._timed("score"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured = {"completions": completions, "rewards_per_func": rewards_per_func}
        return rewards_per_func

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        self._metrics[mode].update({k: [v] for k, v in metrics.padding_metrics(self._padding_sums[mode]).items()})
        self._padding_sums[mode] = {}
        if mode == "train" and "loss" in logs and self._solo_steps() != self.args.steps_per_generation:
            updates.log_skipped_updates(logs, self._updates)
        super().log(logs, start_time)

    @contextmanager
    def _pass(self, name: str):
        """Name the forwards run inside, for ``hacpo/time/padding_ratio/<name>``."""
        outer, self._forward_pass, self._generation_forwards = self._forward_pass, name, 0
        try:
            yield
        finally:
            self._forward_pass = outer

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **flags
    ):
        """TRL's forward at each chunk's own width (:func:`hacpo_trl.run.padding.forward_at_width`), counting tokens
        processed and real; multimodal inputs (in ``flags``) and ``trim_padding=False`` keep TRL's padded forward."""
        name = self._forward_pass
        # inside TRL's step: its old log-probs (when it computes them), then the reference
        if name == "generation":
            trl_old = not self._one_update(self.args.steps_per_generation)
            name = "old_logps" if trl_old and self._generation_forwards == 0 else "ref_logps"
            self._generation_forwards += 1
        self._forward_name = name
        # TRL's no-gradient passes over own rows run in GSPO's solo chunks (a chunk's shape can change a GPU's last
        # bits): gated off, a learner trains bit for bit as GSPO; with peers its own rows differ by float rounding only
        if name in ("old_logps", "ref_logps") and self.model.training:
            rows, solo, size = len(input_ids), self._solo_steps(), self.args.per_device_train_batch_size
            batch_size = schedule.own_rows_chunk(rows, solo, size)
        multimodal = any(v is not None for k, v in flags.items() if not k.startswith("compute_"))
        forward = functools.partial(super()._get_per_token_logps_and_entropies, model, **flags)
        sides = self._trim_sides if self.args.trim_padding and not multimodal else (False, False)
        out, processed = padding.forward_at_width(forward, input_ids, attention_mask, logits_to_keep, batch_size, sides)
        sums = self._padding_sums["train" if self.model.training else "eval"].setdefault(name, [0, 0])
        sums[0], sums[1] = sums[0] + processed, sums[1] + int(attention_mask.sum())
        return out

    def _row_logps(self, model, inputs, rows, batch_size: int | None = None) -> torch.Tensor:
        """Per-token log-probs of some rows' completions, all columns kept: each row as in the full batch."""
        ids = torch.cat([inputs["prompt_ids"][rows], inputs["completion_ids"][rows]], dim=1)
        mask = torch.cat([inputs["prompt_mask"][rows], inputs["completion_mask"][rows]], dim=1)
        keep = inputs["completion_ids"].size(1)
        return self._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=batch_size)[0]

    def _rng_kept(self):
        """A context in which forwards may draw from the RNG (dropout) without moving it for what comes after."""
        device = self.accelerator.device
        devices = [] if device.type == "cpu" else [device.index or 0]
        return torch.random.fork_rng(devices=devices, device_type=device.type)

    @torch.no_grad()
    def _own_old_logps(self, batch: dict) -> torch.Tensor:
        """The old per-token log-probs of this process's completions: TRL's when it computed them, else ours, which
        leave the RNG as they found it (dropout draws from it): an agent that learns from no one stays exactly GSPO."""
        if "old_per_token_logps" in batch:
            return batch["old_per_token_logps"]
        with self._timed("old_logps"), self._pass("old_logps"), self._rng_kept():
            return self._row_logps(self.model, batch, slice(None), self.args.per_device_train_batch_size)

    def _summed(self, values: torch.Tensor) -> list:
        """This rank's vector of ``values`` summed over the agent's ranks (a collective)."""
        return self.accelerator.gather(values).view(-1, values.numel()).sum(0).tolist()

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank of this agent (a collective)."""
        if self.accelerator.num_processes == 1:
            return flag
        return self._summed(torch.tensor([int(flag)], device=self.accelerator.device))[0] > 0

    def _generate_and_score_completions(self, inputs):
        with self._pass("generation"):
            batch = super()._generate_and_score_completions(inputs)
        loading.check_batch_supported(batch)
        batch.pop("sampling_per_token_logps", None)
        mode = "train" if self.model.training else "eval"
        per_func, process = self._captured["rewards_per_func"], self.accelerator.process_index
        rewards = peer_rows.own_rewards(per_func, self.reward_weights, process, len(inputs))  # NaN = unscorable
        columns = peer_rows.add_self_columns(batch, self._own_old_logps(batch), rewards, self.eos_token_ids)
        prompt_ids, step = [x[PROMPT_ID_COLUMN] for x in inputs], self.state.global_step
        if mode == "eval" or len(self.agent_names) == 1 or not self.args.share_rollouts:
            if len(self.agent_names) > 1 and mode == "train":
                self._exchange_capabilities(rewards, prompt_ids)
            return self._own_rows_only(batch)
        texts = [completion_text(c) for c in self._captured["completions"]]
        record = RolloutBatch(self.agent, self.topology.global_rank, step, prompt_ids, texts, **columns)
        records = self.exchange.all_gather(record, what=f"rollouts of step {step}")
        exchange_time = self.exchange.last_seconds
        exchange.check_same_prompts(records, self.agent, step)
        self.last_records, self.last_peer_rows = records, None
        by_agent = self._update_capability(records, mode)
        self._log(mode, metrics.prompt_outcome_metrics(records, self.agent))
        decision = self.last_decision = self._sharing_decision(records)
        rows = None if decision.solo else self._peer_rows(prompt_ids, rewards, by_agent, *decision.rows_args())
        if rows is not None and self.sharing.band_gate:  # the band gate needs a forward over the peer rows
            in_band = self._peers_in_band(batch, rows, prompt_ids, list(decision.involved))
            self._log(mode, {f"hacpo/band_rows/{p}": float(n) for p, n in in_band.items()})
            if 0 in in_band.values():  # a peer closed at this batch: rows and baseline without it
                decision = decision.close_outside_band(in_band)
                rows = None if decision.solo else self._peer_rows(prompt_ids, rewards, by_agent, *decision.rows_args())
        caps, behind = self.capability.capabilities(), self.capability.rows()
        self._log(mode, metrics.sharing_metrics(self.agent, self.agent_names, decision, self.sharing, caps, behind))
        if decision.solo:  # learns from no one at this batch: GSPO's own batch (its records were still shared)
            self._log(mode, metrics.peer_row_metrics([0, 0, 0, 0]))
            if self._one_update(self._solo_steps()):
                # as GSPO on the solo schedule (none: ratio 1 exactly; another shape can change the last bits)
                batch.pop("old_per_token_logps", None)
            return self._own_rows_only(batch)
        # a batch whose peer rows are rescued (or taught, `taught_schedule: solo`) ones only keeps the solo schedule
        plan = self._plan_for(len(prompt_ids), peers=True, few_prompts=decision.few_prompts)
        batch = self._add_peer_rows(batch, rows, prompt_ids, exchange_time, mode, plan.micro_batches)
        self._plan = plan
        return batch

    def _own_rows_only(self, batch: dict) -> dict:
        """TRL's batch of the learner's own rows, with TRL's advantages: what GSPO trains on (with TRL's loss)."""
        if self.model.training:
            self._plan = self._plan_for(len(batch["advantages"]), peers=False, few_prompts=False)
        batch["advantages"] = torch.nan_to_num(batch["advantages"], nan=0.0)
        return batch

    def _exchange_capabilities(self, rewards: torch.Tensor, prompt_ids: list[str]) -> None:
        """Without sharing, agents still exchange rewards (and prompt ids), so every log shows every agent's
        capability and where its peers' answers differ from its own."""
        rank, step = self.topology.global_rank, self.state.global_step
        record = RolloutBatch(self.agent, rank, step, list(prompt_ids), rewards=rewards.tolist())
        records = self.exchange.all_gather(record, what=f"rewards of step {step}")
        self._log("train", metrics.exchange_metrics(self.exchange, self.exchange.last_seconds, 0.0))
        self._update_capability(records, "train")
        self._log("train", metrics.prompt_outcome_metrics(records, self.agent))

    def _update_capability(self, records: list[RolloutBatch], mode: str) -> dict[str, list[RolloutBatch]]:
        step_rewards = exchange.rewards_by_agent(records, self.agent_names)
        if not self._warned_no_reward and (text := no_reward_warning(step_rewards, self.reward_func_names)):
            self._warned_no_reward = True  # once per run
            warnings.warn(text, stacklevel=1)
        self.capability.update(step_rewards)
        low, high = self.args.capability_ratio_min, self.args.capability_ratio_max
        self._log(mode, metrics.capability_step_metrics(self.capability, self.agent, step_rewards, low, high))
        return {agent: [r for r in records if r.agent == agent] for agent in dict.fromkeys(r.agent for r in records)}

    def _sharing_decision(self, records=()) -> PeerDecision:
        """Whom the learner learns from at this batch before the band gate (:func:`hacpo_trl.sharing.decision.decide`)."""
        step, ga = self.state.global_step, self.args.gradient_accumulation_steps
        seen = schedule.batches_seen(step, self._step, ga, self._generate_every)
        caps, rows, training = self.capability.capabilities(), self.capability.rows(), self.model.training
        return decide(self.sharing, self.agent, self.agent_names, caps, rows, seen, step, records, training)

    def _peer_rows(
        self, prompt_ids, rewards, by_agent, peers, only=None, weight=1.0, taught=(), negatives=None
    ) -> peer_rows.PeerRows:
        """The learner's peer rows from ``peers`` (:func:`hacpo_trl.sharing.peer_rows.build_peer_rows`)."""
        records, view = peer_rows.learner_records(by_agent, self.agent, self.agent_names, peers)
        settings = self.sharing.over(self.args)  # the checked sharing options, the config's others
        args = (self.agent, view, self.capability.capabilities(), settings, self._tokenizer, weight, only)
        return peer_rows.build_peer_rows(prompt_ids, rewards, records, *args, taught=taught, negatives=negatives)

    @torch.no_grad()
    def _peers_in_band(self, batch: dict, rows: peer_rows.PeerRows, prompt_ids, peers: list[str]) -> dict[str, int]:
        """Each peer's valid rows in the band [lb_0, 1] now, summed over the agent's ranks (a collective: as many
        forwards on every rank, :func:`hacpo_trl.sharing.peer_loss.band_ratios`); the RNG left as it was: GSPO if all close."""
        trial = self._with_peer_rows(dict(batch), rows, prompt_ids)
        index, size = peer_loss.band_order(trial), max(1, self.args.per_device_train_batch_size)
        most = int(self.accelerator.gather(torch.tensor([len(index)], device=self.accelerator.device)).max())
        with self._pass("band_gate"), self._rng_kept():
            score = functools.partial(self._row_logps, self.model, trial)
            ratio = peer_loss.band_ratios(trial, index, score, size, most, self.hacpo_loss_config)
        counts = peer_loss.band_counts(ratio, rows, peers, self.hacpo_loss_config, self.sharing)
        return dict(zip(peers, self._summed(torch.tensor(counts, device=self.accelerator.device)), strict=True))

    def _with_peer_rows(self, batch: dict, rows: peer_rows.PeerRows, prompt_ids, steps: int | None = None) -> dict:
        """TRL's batch plus ``rows``, for ``steps`` micro-batches (:func:`hacpo_trl.sharing.peer_rows.append_peer_rows`)."""
        prompt_tokens = peer_rows.self_prompt_tokens(prompt_ids, batch["prompt_ids"], batch["prompt_mask"])
        steps, pad_id = steps or self.args.steps_per_generation, self._tokenizer.pad_token_id
        return peer_rows.append_peer_rows(batch, rows, prompt_tokens, prompt_ids, steps, pad_id)

    def _add_peer_rows(self, batch, rows, prompt_ids, exchange_time, mode, steps: int | None = None):
        """Append the peer rows to TRL's batch (for ``steps`` micro-batches); log their counts."""
        batch.pop("old_per_token_logps", None)  # HACPO's loss uses per-sequence old log-probs (hacpo_old_mean_logp)
        self.last_peer_rows = rows
        batch = self._with_peer_rows(batch, rows, prompt_ids, steps)
        counts = [len(rows), rows.rejected, rows.truncated, rows.filtered]
        stats = torch.tensor(counts, dtype=torch.float32, device=batch["completion_ids"].device)
        self._log(mode, metrics.peer_row_metrics(self._summed(stats)))
        self._log(mode, metrics.exchange_metrics(self.exchange, exchange_time, rows.retokenize_seconds))
        return batch

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering, each generation batch cut as its plan says (:func:`hacpo_trl.sharing.peer_rows.micro_batches`)."""
        with self._timed("prepare_inputs"):
            if not self.model.training:
                return self._generate_and_score_completions(generation_batch)
            if self._step % self._generate_every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                self._buffered_inputs = peer_rows.micro_batches(batch, self._plan, self.args)
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _clipped_peer_rows(self, model, inputs, update_index: int):
        """Peer rows outside the band now, which need no backward pass (:func:`hacpo_trl.sharing.peer_loss.score_peer_rows`).
        Under FSDP or ZeRO-3 a forward is a collective, so the agent's ranks decide together: if any has a peer row,
        all run the scoring forward (a rank with none scores one row and drops it); apart, they would deadlock."""
        cfg, candidates = self.hacpo_loss_config, inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
        if cfg.naive or not cfg.peer_clipping or not self.args.skip_clipped_peer_backward:
            return None
        if not self._on_any_rank(bool(candidates.any())):
            return None
        with torch.no_grad(), self._pass("peer_scoring"):
            if not candidates.any():
                self._row_logps(model, inputs, torch.arange(candidates.shape[0], device=candidates.device) == 0)
                return None
            logps = self._row_logps(model, inputs, candidates)
        return peer_loss.score_peer_rows(logps, inputs, candidates, update_index, cfg, self.sharing)

    def _compute_loss(self, model, inputs):
        with self._pass("train"):
            mode = "train" if self.model.training else "eval"
            if not self.args.share_rollouts or (mode == "train" and self._plan.solo):
                # a baseline, or a learner with no peer row at this batch: TRL's own objective, bit for bit GSPO
                return super()._compute_loss(model, inputs)
            ga = self.current_gradient_accumulation_steps
            update_index = self._plan.update_index(self._step, ga) if mode == "train" else 0
            clipped = self._clipped_peer_rows(model, inputs, update_index) if mode == "train" else None
            keep = peer_loss.gradient_rows(inputs["hacpo_is_peer"], clipped)
            if mode == "train" and self.sharing.skip_empty_updates:  # read by training_step at the end of the update
                has_rows = self._on_any_rank(peer_loss.has_gradient_rows(inputs["hacpo_valid"], clipped))
                self._updates.has_rows = bool(self._updates.has_rows) or has_rows
            rows, logps = keep.nonzero().flatten(), self._row_logps(model, inputs, keep)
            on_policy = self._self_on_policy or mode == "eval"
            cfg = self.hacpo_loss_config
            out = peer_loss.rows_loss(logps, inputs, rows, update_index, clipped, cfg, on_policy, self.sharing)
            stats, peer_ratios = metrics.loss_row_sums(out, rows, inputs, clipped, int(keep.sum()))
            self._log(mode, metrics.loss_metrics(self._summed(stats), out.lower_bound, out.kl))
            if mode != "train":
                return out.loss
            self._collect_peer_ratios(peer_ratios, out.lower_bound)
            return out.loss / ga

    def _collect_peer_ratios(self, ratios: torch.Tensor, lower_bound: float) -> None:
        """Keep each peer row's ratio and bound; after a generation batch's last update, log them (a collective)."""
        self._updates.peer_ratios += [(float(r), lower_bound) for r in ratios.tolist()]
        if (self._step + 1) % self._generate_every:
            return
        rows, self._updates.peer_ratios = self._updates.peer_ratios, []
        rows = gather_object(rows) if self.accelerator.num_processes > 1 else rows
        self._log("train", metrics.peer_ratio_metrics(rows))

    def training_step(self, model, inputs, num_items_in_batch=None):
        # the batch's plan decides, not `model.training` (False after an evaluation): skipped ones never reach TRL
        plan = self._plan
        if plan.skips(self._step):
            # beyond `solo_steps_per_generation`: no forward, no gradient, an optimizer step that changes nothing
            if plan.few_prompts and plan.ends_batch(self._step):
                self._collect_peer_ratios(torch.zeros(0), 0.0)  # the batch's last micro-step: log its peer ratios
            model.train()  # as Trainer.training_step would: after an evaluation the logs must read as training's
            self._step += 1  # TRL's micro-batch counter, as its own training_step would advance it
            if self.accelerator.sync_gradients:  # the skipped update's last micro-batch (the Trainer's marker)
                updates.skipped_update(self._updates, self.lr_scheduler)
                self._update_without_gradients()
            return torch.zeros((), device=self.args.device)
        self._prepare_seconds, start = 0.0, time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # the update's last micro-batch, as the Trainer counts them
            self._updates.last_skipped = False
            if self.sharing.skip_empty_updates and not self._updates.take_has_rows():
                model.zero_grad(set_to_none=True)  # no row of it had a gradient, on any rank: no optimizer step
                self._update_without_gradients()
        exchange.end_startup()  # downloads, vLLM start-up and the first generation are behind every agent now
        self._log("train", {"hacpo/time/loss_and_backward": time.perf_counter() - start - self._prepare_seconds})
        return loss

    def _update_without_gradients(self) -> None:
        """A skipped or empty update: its step changes nothing (:func:`hacpo_trl.run.updates.pause_for_no_gradients`)."""
        paused = updates.pause_for_no_gradients(self.accelerator.scaler, self.optimizer)
        if paused is not None:
            self._updates.paused_scaler = paused

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """As `Trainer.save_model`; the final folder gets the HACPO card too (TRL writes it in checkpoints, on push)."""
        super().save_model(output_dir, _internal_call)
        final = os.path.abspath(output_dir or self.args.output_dir) == os.path.abspath(self.args.output_dir)
        if final and not _internal_call:
            self.create_model_card()

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """TRL's card, plus what a HACPO agent needs to be understood: its peers, the recipe and final metrics."""
        with hub_base_model(self.model, self._base_model):  # a built-in copy of a Hub model: named as such
            super().create_model_card(model_name=model_name or self.agent, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            history, step, model_id = self.state.log_history, self.state.global_step, self.hub_model_id
            complete_card(self.args, self.agent, self._base_model, history, step, model_id or self.args.output_dir)

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, then the capability tracker written last (:mod:`hacpo_trl.run.checkpoints`); old ones are
        pruned only once every agent saved this step, so a crash while saving leaves all the previous step."""
        with checkpoints.deferred_limit(self.args) as limit:  # applied below, once every agent has saved
            super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every rank's RNG state is on disk before the folder counts as done
        saving, state = self.args.should_save, (self.state.global_step, self.capability.state_dict())
        where = (self._get_output_dir(trial=trial), self.agent, *state, saving, self.exchange.all_gather)
        checkpoints.save_together(*where, limit=limit, keep=self.state.best_model_checkpoint)  # an exchange

    def train(self, resume_from_checkpoint=None, **kwargs):
        """As `Trainer.train`; ``resume_from_checkpoint=True``: from the newest step every agent saved completely; a
        path to one agent's ``checkpoint-<step>``: every agent from its own checkpoint of that step."""
        main, describe = self.accelerator.process_index == 0, self.topology.describe_rank
        where = (self.agent, self.args.output_dir, main, self.exchange.all_gather, describe, self.capability)
        checkpoint = checkpoints.resume_together(resume_from_checkpoint, *where)  # exchanges: every process calls
        return super().train(resume_from_checkpoint=checkpoint, **kwargs)
