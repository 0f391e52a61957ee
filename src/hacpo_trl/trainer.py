"""`HACPOTrainer`: TRL's `GRPOTrainer` for one agent of a HACPO run, sharing rollouts with the other agents.

Each agent runs this trainer in its own accelerate world (see :mod:`hacpo_trl.topology`), so everything TRL does
(generation with HF or vLLM, reward scoring, DDP/ZeRO/FSDP, saving, logging) stays TRL's. Four hooks change:

* ``_generate_and_score_completions``: after TRL generated and scored this agent's completions, record each one's
  generator log-prob, exchange the records with every other agent, update the capability tracker, decide whom to
  learn from (:mod:`hacpo_trl.sharing`) and append the peer rows after the self rows (:mod:`hacpo_trl.peer_rows`
  builds them: joint capability-aware advantages, the peers' completions re-tokenized into this agent's view, TRL's
  batch layout); the batch's :class:`~hacpo_trl.schedule.BatchPlan` says how it is trained;
* ``_prepare_inputs``: shuffle self and peer rows separately and keep self rows first, so that the stepwise peer
  bound sees peer rows in the later updates of a generation batch, as in the paper; cut the batch as its plan says;
* ``_compute_loss``: the HACPO loss of :func:`hacpo_trl.algorithm.hacpo_loss`; peer rows outside the band skip the
  backward pass (:mod:`hacpo_trl.peer_loss` picks the rows and builds the loss over them);
* ``_save_checkpoint`` / ``train``: the capability tracker is saved in every checkpoint and restored on resume;
  resume picks the newest step that every agent saved completely (the rules are in :mod:`hacpo_trl.checkpoints`).

``_get_per_token_logps_and_entropies``, the forward every pass goes through (TRL's old-log-prob and reference passes,
HACPO's peer scoring and training passes), runs each chunk at its own rows' width (:mod:`hacpo_trl.padding`) and counts
tokens processed against real tokens (``hacpo/time/padding_ratio/*``).

``_generate``, ``_calculate_rewards`` and ``training_step`` are wrapped only to time them (``hacpo/time/*``); with
``share_rollouts=False`` the loss is TRL's own, so the baselines are exactly TRL's GRPO / GSPO.

This module holds the hooks and the glue: every forward pass and every collective over an agent's ranks stays here;
the logic is plain functions in named modules, tested without a trainer (:mod:`~hacpo_trl.sharing`,
:mod:`~hacpo_trl.schedule`, :mod:`~hacpo_trl.peer_rows`, :mod:`~hacpo_trl.peer_loss`, :mod:`~hacpo_trl.metrics`,
:mod:`~hacpo_trl.model_card`, :mod:`~hacpo_trl.loading`).
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from contextlib import contextmanager
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

from . import checkpoints, metrics, padding, schedule, updates
from .algorithm import CapabilityTracker, stepwise_lower_bound
from .config import HACPOConfig
from .exchange import (
    PROMPT_ID_COLUMN,
    Exchange,
    RolloutBatch,
    check_same_prompts,
    end_startup,
    rewards_by_agent,
    with_prompt_ids,
)
from .loading import (
    check_batch_supported,
    check_supported,
    check_trainable_precision,
    moe_loss_message,
    resolve_agent,
)
from .model_card import PAPER, complete_card, hub_base_model
from .peer_loss import batch_row_flags, gradient_rows, has_gradient_rows, peer_log_ratios, rows_loss, score_peer_rows
from .peer_rows import (
    PeerRows,
    add_self_columns,
    append_peer_rows,
    build_peer_rows,
    order_rows,
    own_rewards,
    self_prompt_tokens,
)
from .retokenize import completion_text
from .rewards import no_reward_warning
from .schedule import BatchPlan, UpdateState, plan_batch
from .sharing import PeerDecision, decide, peers_in_band
from .topology import at_exit, current_topology
from .vllm_seed import use_agent_engine_seeds

__all__ = ["HACPOTrainer", "PROMPT_ID_COLUMN"]

# TRL's no-gradient passes over the learner's own rows of a generation batch (`_pass_name`): in training they run in
# the chunks of one update of a solo batch, so that a learner gated off computes them as the GSPO baseline does
_OWN_ROW_PASSES = ("old_logps", "ref_logps")


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
        check_supported(args, kwargs)
        spec = args.agent_spec
        model, self._base_model, processing_class, peft_config = resolve_agent(
            spec, model, processing_class, peft_config
        )
        check_trainable_precision(args, model, peft_config, spec.name)

        use_agent_engine_seeds()  # each agent's vLLM engines sample with their own seeds
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=with_prompt_ids(train_dataset),
            eval_dataset=with_prompt_ids(eval_dataset),
            processing_class=processing_class,
            peft_config=peft_config,
            **kwargs,
        )
        if args.share_rollouts and self.aux_loss_enabled:
            raise ValueError(moe_loss_message(spec.name, type(self.model).__name__, self.router_aux_loss_coef))
        self.topology = current_topology()
        self.exchange = Exchange(self.topology)
        client = getattr(getattr(self, "vllm_generation", None), "vllm_client", None)
        if client is not None:  # vLLM server mode: TRL closes it at `atexit`, which our hard exit skips
            at_exit(client.close_communicator)
        self.agent = spec.name
        self.agent_names = [s.name for s in args.specs]
        self.capability = CapabilityTracker(
            self.agent_names, window=args.capability_window, metric=args.capability_metric
        )
        self.hacpo_loss_config = args.loss_config()
        self.sharing = args.sharing_settings()
        self._captured: dict[str, Any] = {}
        self._prepare_seconds = 0.0
        self._forward_pass, self._generation_forwards = "other", 0
        self._padding_sums: dict[str, dict[str, list[float]]] = {"train": {}, "eval": {}}
        self._trim_sides = padding.trim_sides(self.model.config)  # before any wrapping: which padding may go
        self._updates = UpdateState()  # what the update under way gathers
        # public, for callbacks and `hacpo-probe`: every agent's rollouts of the last generation batch, and the peer
        # rows this learner took from them (None: it learned from no one at that batch)
        self.last_records: list[RolloutBatch] = []
        self.last_peer_rows: PeerRows | None = None
        self.add_callback(metrics.OptimizerTimer(self))
        self.add_callback(updates.ResumeGradScaler(self._updates))
        self._self_on_policy = self._one_update(args.steps_per_generation)
        # how the buffered generation batch is trained, set with each one; before the first: skip nothing
        self._plan: BatchPlan = self._plan_for(0, peers=True, rescue_only=False)

    def _one_update(self, steps: int) -> bool:
        """Whether a generation batch cut into ``steps`` micro-batches serves one update (without vLLM importance
        weights): TRL then computes no old log-probs, and the ratio is 1 exactly."""
        vllm_weights = self.use_vllm and self.vllm_importance_sampling_correction
        return schedule.self_on_policy(self.args.gradient_accumulation_steps, steps * self.num_iterations, vllm_weights)

    @property
    def _generate_every(self) -> int:
        """Micro-batches per generation batch (TRL's `steps_per_generation` × `num_iterations`), what TRL's `_step`
        counts; the optimizer updates are that ÷ `gradient_accumulation_steps`."""
        return self.args.steps_per_generation * self.num_iterations

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._timed("score"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured = {"completions": completions, "rewards_per_func": rewards_per_func}
        return rewards_per_func

    # ------------------------------------------------------------------- where the time goes (hacpo/time/*)

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

    # ------------------------------------------------------------- forwards at their rows' own width (padding)

    @contextmanager
    def _pass(self, name: str):
        """Name the forwards run inside, for ``hacpo/time/padding_ratio/<name>``."""
        outer, self._forward_pass, self._generation_forwards = self._forward_pass, name, 0
        try:
            yield
        finally:
            self._forward_pass = outer

    def _pass_name(self) -> str:
        name = self._forward_pass
        if name == "generation":  # inside TRL's step: its old log-probs (when it computes them), then the reference
            trl_old = not self._one_update(self.args.steps_per_generation)
            name = "old_logps" if trl_old and self._generation_forwards == 0 else "ref_logps"
            self._generation_forwards += 1
        return name

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **extra,
    ):
        """TRL's forward at each chunk's own width (:func:`hacpo_trl.padding.forward_at_width`); multimodal inputs and
        ``trim_padding=False`` keep TRL's padded forward. Counts tokens processed and real (``padding_ratio``)."""
        name = self._forward_name = self._pass_name()
        if name in _OWN_ROW_PASSES and self.model.training:
            # in a solo batch's chunks, as GSPO (a chunk's shape can change the last bits on a GPU): a learner gated
            # off trains bit for bit as GSPO; with peers its own rows' log-probs differ by float rounding only
            rows, solo, size = len(input_ids), self._solo_steps(), self.args.per_device_train_batch_size
            batch_size = schedule.own_rows_chunk(rows, solo, size)
        trim = self.args.trim_padding and all(v is None for v in extra.values())
        flags = {"compute_entropy": compute_entropy, "compute_aux_loss": compute_aux_loss, **extra}
        forward = functools.partial(super()._get_per_token_logps_and_entropies, model, **flags)
        sides = self._trim_sides if trim else (False, False)
        size = batch_size or len(input_ids)
        out, processed = padding.forward_at_width(forward, input_ids, attention_mask, logits_to_keep, size, sides)
        sums = self._padding_sums["train" if self.model.training else "eval"].setdefault(name, [0, 0])
        sums[0] += processed
        sums[1] += int(attention_mask.sum())
        return out

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for key, value in metrics.padding_metrics(self._padding_sums[mode]).items():
            self._metrics[mode][key] = [value]
        self._padding_sums[mode] = {}
        if mode == "train" and "loss" in logs and self._solo_steps() != self.args.steps_per_generation:
            updates.log_skipped_updates(logs, self._updates)
        super().log(logs, start_time)

    def training_step(self, model, inputs, num_items_in_batch=None):
        # the batch's plan decides, not `model.training` (False after an evaluation until TRL's training_step sets
        # it): a skipped micro-batch must never reach TRL's loss
        plan = self._plan
        if plan.skips(self._step):
            # a solo batch's update beyond `solo_steps_per_generation`: no forward or backward, no gradient, so the
            # optimizer step changes nothing (AdamW skips such parameters); every rank of the agent skips together
            if plan.rescue_only and plan.ends_batch(self._step):
                self._collect_peer_ratios(torch.zeros(0), 0.0)  # the batch's last micro-step: log its peer ratios
            model.train()  # as Trainer.training_step would: after an evaluation the logs must read as training's
            self._step += 1  # TRL's micro-batch counter, as its own training_step would advance it
            if self.accelerator.sync_gradients:  # the skipped update's last micro-batch (the Trainer's marker)
                updates.skipped_update(self._updates, self.lr_scheduler)
                self._update_without_gradients()
            return torch.zeros((), device=self.args.device)
        self._prepare_seconds = 0.0
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # the update's last micro-batch, as the Trainer counts them
            self._updates.last_skipped = False
            if self.sharing.skip_empty_updates and not self._updates.take_has_rows():
                model.zero_grad(set_to_none=True)  # no row of it had a gradient, on any rank: no optimizer step
                self._update_without_gradients()
        end_startup()  # downloads, vLLM start-up and the first generation are behind every agent now
        self._metrics["train"]["hacpo/time/loss_and_backward"].append(
            time.perf_counter() - start - self._prepare_seconds
        )
        return loss

    def _update_without_gradients(self) -> None:
        """A skipped update, or an empty one (`skip_empty_updates`), leaves every parameter without a gradient: its
        optimizer step must change nothing (:func:`~hacpo_trl.updates.pause_for_no_gradients`)."""
        paused = updates.pause_for_no_gradients(self.accelerator.scaler, self.optimizer)
        if paused is not None:
            self._updates.paused_scaler = paused

    def _rng_kept(self):
        """A context in which forwards may draw from the RNG (dropout) without moving it for what comes after."""
        device = self.accelerator.device
        devices = [] if device.type == "cpu" else [device.index or 0]
        return torch.random.fork_rng(devices=devices, device_type=device.type)

    @torch.no_grad()
    def _own_old_logps(self, batch: dict) -> torch.Tensor:
        """The old per-token log-probs of this process's completions: TRL's when it computed them, else ours. Ours
        leave the RNG as they found it (a model with dropout would draw from it), so that generation afterwards
        samples as in TRL's own run: an agent that learns from no one stays exactly GSPO."""
        if "old_per_token_logps" in batch:
            return batch["old_per_token_logps"]
        with self._timed("old_logps"), self._pass("old_logps"), self._rng_kept():
            prompt_completion = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                prompt_completion,
                attention,
                batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,  # in training, `schedule.own_rows_chunk`'s
            )
            return logps

    # ---------------------------------------------------------------------------------------------- the step

    def _generate_and_score_completions(self, inputs):
        with self._pass("generation"):
            batch = super()._generate_and_score_completions(inputs)
        check_batch_supported(batch)
        batch.pop("sampling_per_token_logps", None)
        mode = "train" if self.model.training else "eval"
        per_func, process = self._captured["rewards_per_func"], self.accelerator.process_index
        rewards = own_rewards(per_func, self.reward_weights, process, len(inputs))  # NaN = unscorable
        columns = add_self_columns(batch, self._own_old_logps(batch), rewards, self.eos_token_ids)
        if mode == "eval" or len(self.agent_names) == 1 or not self.args.share_rollouts:
            if len(self.agent_names) > 1 and mode == "train":
                self._exchange_capabilities(rewards)
            return self._own_rows_only(batch)

        texts = [completion_text(c) for c in self._captured["completions"]]
        prompt_ids = [x[PROMPT_ID_COLUMN] for x in inputs]
        step, rank = self.state.global_step, self.topology.global_rank
        record = RolloutBatch(self.agent, rank, step, prompt_ids, texts, **columns)
        start = time.perf_counter()
        records = self.exchange.all_gather(record, what=f"rollouts of step {self.state.global_step}")
        exchange_time = time.perf_counter() - start
        check_same_prompts(records, self.agent, self.state.global_step)
        self.last_records, self.last_peer_rows = records, None
        by_agent = self._update_capability(records, mode)
        decision = self._sharing_decision(records)
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
                # GSPO with the solo schedule makes one update of the batch and computes no old log-probs (its ratio
                # is 1 exactly); TRL computed them for the sharing schedule, and a forward of another shape can
                # differ in the last bits on a GPU
                batch.pop("old_per_token_logps", None)
            return self._own_rows_only(batch)
        # a batch whose peer rows are rescued ones only is cut into the micro-batches of a batch learned from no one
        plan = self._plan_for(len(prompt_ids), peers=True, rescue_only=decision.rescue_only)
        batch = self._add_peer_rows(batch, rows, prompt_ids, exchange_time, mode, plan.micro_batches)
        self._plan = plan
        return batch

    def _own_rows_only(self, batch: dict) -> dict:
        """TRL's batch of the learner's own rows, with TRL's advantages: what GSPO trains on (with TRL's loss)."""
        if self.model.training:
            self._plan = self._plan_for(len(batch["advantages"]), peers=False, rescue_only=False)
        batch["advantages"] = torch.nan_to_num(batch["advantages"], nan=0.0)
        return batch

    def _plan_for(self, own_rows: int, peers: bool, rescue_only: bool) -> BatchPlan:
        steps, solo = self.args.steps_per_generation, self._solo_steps()
        return plan_batch(own_rows, peers, rescue_only, steps, solo, self.num_iterations)

    def _sharing_decision(self, records=()) -> PeerDecision:
        """Whom this learner learns from at this batch (:func:`hacpo_trl.sharing.decide`), before the band gate: the
        capability gate counts the generation batches before this one; every rank of the agent decides alike."""
        seen = schedule.batches_seen(
            self.state.global_step, self._step, self.args.gradient_accumulation_steps, self._generate_every
        )
        caps, rows = self.capability.capabilities(), self.capability.rows()
        step, training = self.state.global_step, self.model.training
        return decide(self.sharing, self.agent, self.agent_names, caps, rows, seen, step, records, training)

    def _peer_rows(self, prompt_ids, rewards, by_agent, peers, only=None, weight: float = 1.0, taught=()) -> PeerRows:
        """The learner's peer rows from ``peers`` (:func:`~hacpo_trl.peer_rows.build_peer_rows`): only the learner's
        and these peers' records enter, their rewards included (the baseline); a peer in ``only`` only on those
        prompts; ``weight`` scales the peer rows' advantages; a peer in ``taught`` gives taught rows."""
        by_agent = {agent: by_agent[agent] for agent in (self.agent, *peers) if agent in by_agent}
        records = [r for agent_records in by_agent.values() for r in agent_records]
        learners_view = [a for a in self.agent_names if a in by_agent]  # the learner and the peers it learns from
        caps, tok = self.capability.capabilities(), self._tokenizer
        args = (self.agent, learners_view, caps, self.args, tok, weight, only)
        return build_peer_rows(prompt_ids, rewards, records, *args, taught=taught)

    @torch.no_grad()
    def _peers_in_band(self, batch: dict, rows: PeerRows, prompt_ids, peers: list[str]) -> dict[str, int]:
        """How many of each peer's valid rows lie in the band [lb_0, 1] under the learner now, summed over the
        agent's ranks (a collective: every rank of the agent calls it). Scored in forwards of
        `per_device_train_batch_size` rows, as TRL's no-gradient passes (all of a rank's peer rows in one forward
        would hold some hundred times a training forward's activations at the paper's scale), and in the same number
        of forwards on every rank, the most any rank needs (a rank short of rows scores one row and drops it), since
        under FSDP / ZeRO-3 a forward is a collective too. The RNG is left as it was, so that a learner whose peers
        all close generates and trains exactly as GSPO."""
        trial = self._with_peer_rows(dict(batch), rows, prompt_ids)
        candidates = trial["hacpo_is_peer"] & trial["hacpo_valid"]
        index = candidates.nonzero().flatten()
        lengths = torch.cat([trial["prompt_mask"], trial["completion_mask"]], dim=1)[index]
        index = index[padding.length_order(lengths)]  # rows of similar length share a forward
        size = max(1, self.args.per_device_train_batch_size)
        count = torch.tensor([len(index)], device=self.accelerator.device)
        forwards = max(1, math.ceil(int(self.accelerator.gather(count).max()) / size))
        cfg = self.hacpo_loss_config
        ratio = torch.full((len(candidates),), float("nan"), device=candidates.device)
        with self._pass("band_gate"), self._rng_kept():
            for k in range(forwards):
                chunk = index[k * size : (k + 1) * size]
                scored = torch.zeros_like(candidates)
                scored[chunk if len(chunk) else 0] = True
                logps = self._row_logps(self.model, trial, scored)
                if len(chunk):
                    ratio[scored] = peer_log_ratios(logps, trial, scored, cfg).exp().float()
        ratio = ratio[candidates]
        sources = [s for s, ok in zip(rows.sources, rows.valid, strict=True) if ok]
        bound = stepwise_lower_bound(0, cfg.delta, cfg.delta_step)
        counts = peers_in_band(ratio, sources, peers, bound)
        local = torch.tensor([counts[p] for p in peers], dtype=torch.long, device=self.accelerator.device)
        total = self.accelerator.gather(local).view(-1, len(peers)).sum(0).tolist()
        return dict(zip(peers, total, strict=True))

    def _exchange_capabilities(self, rewards: torch.Tensor) -> None:
        """Without sharing, agents still exchange rewards so every log shows every agent's capability (and so they
        also wait for each other once per generation batch: logged as with sharing)."""
        rank, step = self.topology.global_rank, self.state.global_step
        record = RolloutBatch(self.agent, rank, step, [""] * len(rewards), rewards=rewards.tolist())
        start = time.perf_counter()
        records = self.exchange.all_gather(record, what=f"rewards of step {self.state.global_step}")
        self._log("train", metrics.exchange_metrics(self.exchange, time.perf_counter() - start, 0.0))
        self._update_capability(records, "train")

    def _update_capability(self, records: list[RolloutBatch], mode: str) -> dict[str, list[RolloutBatch]]:
        step_rewards = rewards_by_agent(records, self.agent_names)
        if not getattr(self, "_warned_no_reward", False) and (
            text := no_reward_warning(step_rewards, self.reward_func_names)
        ):
            self._warned_no_reward = True  # once per run
            warnings.warn(text, stacklevel=1)
        self.capability.update(step_rewards)
        caps = self.capability.capabilities()
        low, high = self.args.capability_ratio_min, self.args.capability_ratio_max
        omegas = {a: self.capability.omega(a, self.agent, low, high) for a in self.agent_names if a != self.agent}
        self._log(mode, metrics.capability_metrics(caps, step_rewards, omegas))
        return {agent: [r for r in records if r.agent == agent] for agent in dict.fromkeys(r.agent for r in records)}

    def _log(self, mode: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[mode][key].append(value)

    def _with_peer_rows(self, batch: dict, rows: PeerRows, prompt_ids, steps: int | None = None) -> dict:
        """TRL's batch with ``rows`` appended (:func:`~hacpo_trl.peer_rows.append_peer_rows`), padded to a whole
        number of rows in each of ``steps`` micro-batches (default `steps_per_generation`)."""
        prompt_tokens = self_prompt_tokens(prompt_ids, batch["prompt_ids"], batch["prompt_mask"])
        pad_id = self._tokenizer.pad_token_id
        steps = steps or self.args.steps_per_generation
        return append_peer_rows(batch, rows, prompt_tokens, prompt_ids, steps, pad_id)

    def _add_peer_rows(self, batch, rows: PeerRows, prompt_ids, exchange_time, mode, steps: int | None = None):
        """Append the peer rows to TRL's batch (for ``steps`` micro-batches); log their counts."""
        batch.pop("old_per_token_logps", None)  # HACPO's loss uses per-sequence old log-probs (hacpo_old_mean_logp)
        self.last_peer_rows = rows
        batch = self._with_peer_rows(batch, rows, prompt_ids, steps)
        counts = [len(rows), rows.rejected, rows.truncated, rows.filtered]
        stats = torch.tensor(counts, dtype=torch.float32, device=batch["completion_ids"].device)
        self._log(mode, metrics.peer_row_metrics(self.accelerator.gather(stats).view(-1, 4).sum(0).tolist()))
        self._log(mode, metrics.exchange_metrics(self.exchange, exchange_time, rows.retokenize_seconds))
        return batch

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering, but each generation batch cut as its plan says (`schedule.BatchPlan`): self rows shuffled
        among themselves and kept before the shuffled peer rows, a solo batch's skipped micro-batches None."""
        with self._timed("prepare_inputs"):
            if not self.model.training:
                return self._generate_and_score_completions(generation_batch)
            if self._step % self._generate_every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                plan, steps = self._plan, self._plan.micro_batches
                if plan.solo:  # own rows only, trained with TRL's own loss (`_hacpo_loss`)
                    batch = shuffle_sequence_dict(batch)  # exactly TRL's order when there are no peer rows
                else:  # a batch of rescued rows only: each micro-batch holds GSPO's share of the own rows
                    layout = "interleaved" if plan.rescue_only else self.args.peer_layout
                    batch = order_rows(batch, plan.own_rows, steps, layout)
                if self.args.group_by_length:  # within each update, between rows of equal weight
                    ga, hacpo = self.args.gradient_accumulation_steps, self.args.share_rollouts
                    batch = padding.group_by_length(batch, steps, ga, hacpo)
                skipped = [None] * (self.args.steps_per_generation - steps)  # skipped by training_step
                self._buffered_inputs = split_tensor_dict(batch, steps) + skipped
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _solo_steps(self) -> int:
        """Micro-batches of a generation batch of own rows only (:func:`hacpo_trl.schedule.solo_steps`)."""
        sharing = self.args.share_rollouts and len(self.agent_names) > 1 and self.model.training
        return schedule.solo_steps(self.args.steps_per_generation, self.args.solo_steps_per_generation, sharing)

    # ------------------------------------------------------------------------------------------------- loss

    def _row_logps(self, model, inputs, rows: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs of the completions of some rows of a mini-batch (all columns kept, so every row is
        computed exactly as in the full batch)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"][rows], inputs["prompt_mask"][rows]
        completion_ids, mask = inputs["completion_ids"][rows], inputs["completion_mask"][rows]
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, mask], dim=1),
            completion_ids.size(1),
        )
        return logps

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank of this agent (a collective: every rank of the agent must call it)."""
        if self.accelerator.num_processes == 1:
            return flag
        value = torch.tensor([int(flag)], device=self.accelerator.device)
        return bool(self.accelerator.gather(value).max())

    def _clipped_peer_rows(self, model, inputs, update_index: int):
        """Peer rows whose ratio is outside the band now: they get no gradient, so they need no backward pass.

        One forward without gradient scores every peer row; the returned mask marks the rows to leave out of the
        gradient pass, with their (constant) objective and ratio. Returns None when nothing can be left out.

        Under FSDP or ZeRO-3 every forward is a collective over the agent's ranks, and the ranks of one agent can hold
        different numbers of peer rows (``peer_filter="correct"``, rejected or padding rows), so whether the scoring
        forward runs is decided by all of them together: if any rank has a peer row to score, every rank runs it (a
        rank with none scores one row and discards it). A per-rank decision deadlocks or crashes the agent's world.
        """
        cfg = self.hacpo_loss_config
        candidates = inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
        if cfg.naive or not cfg.peer_clipping or not self.args.skip_clipped_peer_backward:
            return None
        if not self._on_any_rank(bool(candidates.any())):
            return None
        with torch.no_grad(), self._pass("peer_scoring"):
            if not candidates.any():
                self._row_logps(model, inputs, torch.arange(candidates.shape[0], device=candidates.device) == 0)
                return None
            logps = self._row_logps(model, inputs, candidates)
        return score_peer_rows(logps, inputs, candidates, update_index, cfg)

    def _compute_loss(self, model, inputs):
        with self._pass("train"):
            return self._hacpo_loss(model, inputs)

    def _hacpo_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        if not self.args.share_rollouts or (mode == "train" and self._plan.solo):
            # an independent baseline, or a learner with no peer row at this batch: TRL's own objective, untouched,
            # so that it trains bit for bit as GSPO (hacpo_loss equals it only up to float rounding)
            return super()._compute_loss(model, inputs)
        ga = self.current_gradient_accumulation_steps
        update_index = self._plan.update_index(self._step, ga) if mode == "train" else 0
        is_peer, valid = inputs["hacpo_is_peer"], inputs["hacpo_valid"]
        clipped = self._clipped_peer_rows(model, inputs, update_index) if mode == "train" else None
        keep = gradient_rows(is_peer, clipped)
        if mode == "train" and self.sharing.skip_empty_updates:  # read by training_step at the end of the update
            has_rows = self._on_any_rank(has_gradient_rows(valid, clipped))
            self._updates.has_rows = bool(self._updates.has_rows) or has_rows
        rows = keep.nonzero().flatten()
        logps = self._row_logps(model, inputs, keep)
        on_policy = self._self_on_policy or mode == "eval"
        out = rows_loss(logps, inputs, rows, update_index, clipped, self.hacpo_loss_config, self_on_policy=on_policy)
        # metrics over the whole mini-batch, the rows left out of the gradient pass included
        ratio, low, high, self_clipped = batch_row_flags(out, rows, is_peer, clipped)
        peer, own = is_peer & valid, ~is_peer & valid
        stats = metrics.loss_metric_sums(ratio, low, high, self_clipped, peer, own, int(keep.sum()))
        sums = self.accelerator.gather(stats).view(-1, metrics.LOSS_SUMS).sum(0).tolist()
        self._log(mode, metrics.loss_metrics(sums, out.lower_bound, out.kl))
        if mode != "train":
            return out.loss
        self._collect_peer_ratios(ratio[peer], out.lower_bound)
        return out.loss / self.current_gradient_accumulation_steps

    def _collect_peer_ratios(self, ratios: torch.Tensor, lower_bound: float) -> None:
        """Keep every peer row's ratio and bound over a generation batch; after its last update, log the median,
        geometric mean, share in band and mean bound applied over the whole batch (all ranks of this agent)."""
        from accelerate.utils import gather_object

        buffer = self._updates.peer_ratios
        buffer += [(float(r), lower_bound) for r in ratios.tolist()]
        if (self._step + 1) % self._generate_every:
            return
        rows = gather_object(buffer) if self.accelerator.num_processes > 1 else buffer
        self._updates.peer_ratios = []
        self._log("train", metrics.peer_ratio_metrics(rows))

    # -------------------------------------------------------------------------------------- saving and resume

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """As `Trainer.save_model`; the agent's final folder also gets the HACPO model card (TRL writes it only
        into checkpoints and on push, so a saved agent would otherwise carry no card, or PEFT's blank one)."""
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
        """TRL's checkpoint, then the capability tracker written last and atomically: a checkpoint folder without
        ``hacpo_state.json`` was interrupted while saving and is never resumed from. ``save_total_limit`` is applied
        here, not inside TRL's save, and only once every agent has completed this step's checkpoint: a crash while
        any agent saves leaves every agent the previous step to resume from."""
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # every rank's RNG state is on disk before the folder counts as done
        run_dir = self._get_output_dir(trial=trial)
        if self.args.should_save:
            checkpoints.save_state(run_dir, self.agent, self.state.global_step, self.capability.state_dict())
        self.exchange.all_gather((self.agent, self.state.global_step), what="checkpoint saved by every agent")
        if limit and self.args.should_save:
            checkpoints.prune_checkpoints(run_dir, limit, keep=self.state.best_model_checkpoint)

    def train(self, resume_from_checkpoint=None, **kwargs):
        """As `Trainer.train`; ``resume_from_checkpoint=True`` resumes every agent from the newest step that all
        agents saved completely (a checkpoint interrupted while saving is skipped, never loaded)."""
        complete = checkpoints.complete_checkpoints(self.args.output_dir)
        report = (self.agent, self.accelerator.process_index == 0, sorted(complete), resume_from_checkpoint)
        everyone = self.exchange.all_gather(report, what="checkpoints to resume from")
        where = (self.agent, complete, everyone, self.topology.describe_rank)
        checkpoint = checkpoints.chosen_checkpoint(resume_from_checkpoint, *where)
        state = checkpoints.read_state(checkpoint, self.agent) if checkpoint else {"global_step": 0}
        if checkpoint:
            self.capability.load_state_dict(state["capability"])
        checkpoints.check_same_start(self.exchange.all_gather((self.agent, state["global_step"]), what="resume steps"))
        return super().train(resume_from_checkpoint=checkpoint, **kwargs)
