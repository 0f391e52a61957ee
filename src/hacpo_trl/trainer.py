"""`HACPOTrainer`: TRL's `GRPOTrainer` for one agent of a HACPO run, sharing rollouts with the other agents.

Each agent runs this trainer in its own accelerate world (:mod:`hacpo_trl.topology`), so generation (HF or vLLM),
reward scoring, DDP/ZeRO/FSDP, saving and logging stay TRL's. The hooks: ``_generate_and_score_completions`` exchanges
every agent's records, updates the capability tracker and appends the learner's peer rows (:mod:`~hacpo_trl.sharing`
decides whom it learns from, :mod:`~hacpo_trl.peer_rows` builds the rows); ``_prepare_inputs`` cuts each batch as its
plan says (:mod:`~hacpo_trl.schedule`); ``_compute_loss`` is the HACPO loss, peer rows outside the band skipping the
backward pass (:mod:`~hacpo_trl.peer_loss`); ``training_step`` skips the updates the plan skips
(:mod:`~hacpo_trl.updates`); every forward runs each chunk at its own width (:mod:`~hacpo_trl.padding`); checkpoints
keep the capability tracker (:mod:`~hacpo_trl.checkpoints`). With ``share_rollouts=False`` the loss is TRL's own, so
the baselines are exactly TRL's GRPO / GSPO. This module is the glue: every forward pass and every collective over
an agent's ranks is here, the logic in those modules, tested without a trainer.
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

from . import checkpoints, exchange, loading, metrics, padding, peer_loss, peer_rows, schedule, updates
from .algorithm import CapabilityTracker
from .config import HACPOConfig
from .exchange import PROMPT_ID_COLUMN, RolloutBatch
from .model_card import PAPER, complete_card, hub_base_model
from .retokenize import completion_text
from .rewards import no_reward_warning
from .sharing import PeerDecision, decide
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
        agent = loading.prepare_agent(args, kwargs, model, processing_class, peft_config)
        model, self._base_model, processing_class, peft_config = agent
        use_agent_engine_seeds()  # each agent's vLLM engines sample with their own seeds
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=exchange.with_prompt_ids(train_dataset),
            eval_dataset=exchange.with_prompt_ids(eval_dataset),
            processing_class=processing_class,
            peft_config=peft_config,
            **kwargs,
        )
        self.agent, self.agent_names = args.agent_spec.name, [s.name for s in args.specs]
        if args.share_rollouts and self.aux_loss_enabled:
            raise ValueError(loading.moe_loss_message(self.agent, type(self.model).__name__, self.router_aux_loss_coef))
        self.topology = current_topology()
        self.exchange = exchange.Exchange(self.topology)
        client = getattr(getattr(self, "vllm_generation", None), "vllm_client", None)
        if client is not None:  # vLLM server mode: TRL closes it at `atexit`, which our hard exit skips
            at_exit(client.close_communicator)
        self.capability = CapabilityTracker(
            self.agent_names, window=args.capability_window, metric=args.capability_metric
        )
        self.hacpo_loss_config, self.sharing = args.loss_config(), args.sharing_settings()
        self._captured: dict[str, Any] = {}
        self._prepare_seconds = 0.0
        self._forward_pass, self._generation_forwards = "other", 0
        self._padding_sums: dict[str, dict[str, list[float]]] = {"train": {}, "eval": {}}
        self._trim_sides = padding.trim_sides(self.model.config)  # before any wrapping: which padding may go
        self._updates = schedule.UpdateState()  # what the update under way gathers
        # public, for callbacks and `hacpo-probe`: every agent's rollouts of the last generation batch, and the peer
        # rows this learner took from them (None: it learned from no one at that batch)
        self.last_records: list[RolloutBatch] = []
        self.last_peer_rows: peer_rows.PeerRows | None = None
        self.add_callback(metrics.OptimizerTimer(self))
        self.add_callback(updates.ResumeGradScaler(self._updates))
        self._self_on_policy = self._one_update(args.steps_per_generation)
        # how the buffered generation batch is trained, set with each one; before the first: skip nothing
        self._plan: schedule.BatchPlan = self._plan_for(0, peers=True, rescue_only=False)

    def _one_update(self, steps: int) -> bool:
        """Whether a generation batch cut into ``steps`` micro-batches serves one update (without vLLM importance
        weights): TRL then computes no old log-probs, and the ratio is 1 exactly."""
        vllm_weights = self.use_vllm and self.vllm_importance_sampling_correction
        return schedule.self_on_policy(self.args.gradient_accumulation_steps, steps * self.num_iterations, vllm_weights)

    @property
    def _generate_every(self) -> int:
        """Micro-batches per generation batch (TRL's `steps_per_generation` × `num_iterations`), as TRL's `_step`
        counts them."""
        return self.args.steps_per_generation * self.num_iterations

    def _solo_steps(self) -> int:
        """Micro-batches of a generation batch of own rows only (:func:`hacpo_trl.schedule.solo_steps`)."""
        sharing = self.args.share_rollouts and len(self.agent_names) > 1 and self.model.training
        return schedule.solo_steps(self.args.steps_per_generation, self.args.solo_steps_per_generation, sharing)

    def _plan_for(self, own_rows: int, peers: bool, rescue_only: bool) -> schedule.BatchPlan:
        steps, solo = self.args.steps_per_generation, self._solo_steps()
        return schedule.plan_batch(own_rows, peers, rescue_only, steps, solo, self.num_iterations)

    def _log(self, mode: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[mode][key].append(value)

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

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._timed("score"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured = {"completions": completions, "rewards_per_func": rewards_per_func}
        return rewards_per_func

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for key, value in metrics.padding_metrics(self._padding_sums[mode]).items():
            self._metrics[mode][key] = [value]
        self._padding_sums[mode] = {}
        if mode == "train" and "loss" in logs and self._solo_steps() != self.args.steps_per_generation:
            updates.log_skipped_updates(logs, self._updates)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------ forwards

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

    def _row_logps(self, model, inputs, rows, batch_size: int | None = None) -> torch.Tensor:
        """Per-token log-probs of the completions of some rows of a batch (all columns kept, so every row is
        computed exactly as in the full batch)."""
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
        """The old per-token log-probs of this process's completions: TRL's when it computed them, else ours. Ours
        leave the RNG as they found it (a model with dropout would draw from it), so that generation afterwards
        samples as in TRL's own run: an agent that learns from no one stays exactly GSPO."""
        if "old_per_token_logps" in batch:
            return batch["old_per_token_logps"]
        with self._timed("old_logps"), self._pass("old_logps"), self._rng_kept():
            # chunks of `per_device_train_batch_size` rows; in training, `schedule.own_rows_chunk`'s
            return self._row_logps(self.model, batch, slice(None), self.args.per_device_train_batch_size)

    # ------------------------------------------------------------------------------- collectives over the ranks

    def _summed(self, values: torch.Tensor) -> list:
        """This rank's vector of ``values`` summed over the agent's ranks (a collective)."""
        return self.accelerator.gather(values).view(-1, values.numel()).sum(0).tolist()

    def _on_any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank of this agent (a collective: every rank of the agent must call it)."""
        if self.accelerator.num_processes == 1:
            return flag
        value = torch.tensor([int(flag)], device=self.accelerator.device)
        return bool(self.accelerator.gather(value).max())

    # --------------------------------------------------------------------------------------- the generation batch

    def _generate_and_score_completions(self, inputs):
        with self._pass("generation"):
            batch = super()._generate_and_score_completions(inputs)
        loading.check_batch_supported(batch)
        batch.pop("sampling_per_token_logps", None)
        mode = "train" if self.model.training else "eval"
        per_func, process = self._captured["rewards_per_func"], self.accelerator.process_index
        rewards = peer_rows.own_rewards(per_func, self.reward_weights, process, len(inputs))  # NaN = unscorable
        columns = peer_rows.add_self_columns(batch, self._own_old_logps(batch), rewards, self.eos_token_ids)
        if mode == "eval" or len(self.agent_names) == 1 or not self.args.share_rollouts:
            if len(self.agent_names) > 1 and mode == "train":
                self._exchange_capabilities(rewards)
            return self._own_rows_only(batch)
        texts = [completion_text(c) for c in self._captured["completions"]]
        prompt_ids, step = [x[PROMPT_ID_COLUMN] for x in inputs], self.state.global_step
        record = RolloutBatch(self.agent, self.topology.global_rank, step, prompt_ids, texts, **columns)
        start = time.perf_counter()
        records = self.exchange.all_gather(record, what=f"rollouts of step {step}")
        exchange_time = time.perf_counter() - start
        exchange.check_same_prompts(records, self.agent, step)
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

    def _exchange_capabilities(self, rewards: torch.Tensor) -> None:
        """Without sharing, agents still exchange rewards so every log shows every agent's capability (and so they
        also wait for each other once per generation batch: logged as with sharing)."""
        rank, step = self.topology.global_rank, self.state.global_step
        record = RolloutBatch(self.agent, rank, step, [""] * len(rewards), rewards=rewards.tolist())
        start = time.perf_counter()
        records = self.exchange.all_gather(record, what=f"rewards of step {step}")
        self._log("train", metrics.exchange_metrics(self.exchange, time.perf_counter() - start, 0.0))
        self._update_capability(records, "train")

    def _update_capability(self, records: list[RolloutBatch], mode: str) -> dict[str, list[RolloutBatch]]:
        step_rewards = exchange.rewards_by_agent(records, self.agent_names)
        if not getattr(self, "_warned_no_reward", False) and (
            text := no_reward_warning(step_rewards, self.reward_func_names)
        ):
            self._warned_no_reward = True  # once per run
            warnings.warn(text, stacklevel=1)
        self.capability.update(step_rewards)
        low, high = self.args.capability_ratio_min, self.args.capability_ratio_max
        omegas = {a: self.capability.omega(a, self.agent, low, high) for a in self.agent_names if a != self.agent}
        self._log(mode, metrics.capability_metrics(self.capability.capabilities(), step_rewards, omegas))
        return {agent: [r for r in records if r.agent == agent] for agent in dict.fromkeys(r.agent for r in records)}

    def _sharing_decision(self, records=()) -> PeerDecision:
        """Whom this learner learns from at this batch (:func:`hacpo_trl.sharing.decide`), before the band gate: the
        capability gate counts the generation batches before this one; every rank of the agent decides alike."""
        step, ga = self.state.global_step, self.args.gradient_accumulation_steps
        seen = schedule.batches_seen(step, self._step, ga, self._generate_every)
        caps, rows, training = self.capability.capabilities(), self.capability.rows(), self.model.training
        return decide(self.sharing, self.agent, self.agent_names, caps, rows, seen, step, records, training)

    def _peer_rows(self, prompt_ids, rewards, by_agent, peers, only=None, weight=1.0, taught=()) -> peer_rows.PeerRows:
        """The learner's peer rows from ``peers`` (:func:`~hacpo_trl.peer_rows.build_peer_rows`): only the learner's
        and these peers' records enter, their rewards included (the baseline)."""
        by_agent = {agent: by_agent[agent] for agent in (self.agent, *peers) if agent in by_agent}
        records = [r for agent_records in by_agent.values() for r in agent_records]
        learners_view = [a for a in self.agent_names if a in by_agent]  # the learner and the peers it learns from
        caps, tok = self.capability.capabilities(), self._tokenizer
        args = (self.agent, learners_view, caps, self.args, tok, weight, only)
        return peer_rows.build_peer_rows(prompt_ids, rewards, records, *args, taught=taught)

    @torch.no_grad()
    def _peers_in_band(self, batch: dict, rows: peer_rows.PeerRows, prompt_ids, peers: list[str]) -> dict[str, int]:
        """How many of each peer's valid rows lie in the band [lb_0, 1] under the learner now, summed over the agent's
        ranks (a collective). Every rank runs the forwards the rank with the most rows needs
        (:func:`hacpo_trl.peer_loss.band_ratios`), leaving the RNG as it was: a learner whose peers all close
        generates and trains exactly as GSPO."""
        trial = self._with_peer_rows(dict(batch), rows, prompt_ids)
        index, size = peer_loss.band_order(trial), max(1, self.args.per_device_train_batch_size)
        most = int(self.accelerator.gather(torch.tensor([len(index)], device=self.accelerator.device)).max())
        cfg, forwards = self.hacpo_loss_config, max(1, math.ceil(most / size))
        with self._pass("band_gate"), self._rng_kept():
            score = functools.partial(self._row_logps, self.model, trial)
            ratio = peer_loss.band_ratios(trial, index, score, size, forwards, cfg)
        local = torch.tensor(peer_loss.band_counts(ratio, rows, peers, cfg), device=self.accelerator.device)
        return dict(zip(peers, self._summed(local), strict=True))

    def _with_peer_rows(self, batch: dict, rows: peer_rows.PeerRows, prompt_ids, steps: int | None = None) -> dict:
        """TRL's batch with ``rows`` appended (:func:`~hacpo_trl.peer_rows.append_peer_rows`), padded to a whole
        number of rows in each of ``steps`` micro-batches (default `steps_per_generation`)."""
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
        """TRL's buffering, but each generation batch cut as its plan says (:func:`hacpo_trl.peer_rows.micro_batches`):
        self rows first, a solo batch's skipped micro-batches None."""
        with self._timed("prepare_inputs"):
            if not self.model.training:
                return self._generate_and_score_completions(generation_batch)
            if self._step % self._generate_every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                self._buffered_inputs = peer_rows.micro_batches(batch, self._plan, self.args)
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------------------------------ loss and step

    def _clipped_peer_rows(self, model, inputs, update_index: int):
        """Peer rows whose ratio is outside the band now (:func:`hacpo_trl.peer_loss.score_peer_rows`): they need no
        backward pass. None when nothing can be left out. Whether the scoring forward runs is decided by all of the
        agent's ranks together (under FSDP or ZeRO-3 a forward is a collective, and ranks can hold different numbers
        of peer rows): if any rank has a peer row, every rank runs it, a rank with none scoring one row and dropping
        it. A per-rank decision deadlocks or crashes the agent's world."""
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
        return peer_loss.score_peer_rows(logps, inputs, candidates, update_index, cfg)

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
        clipped = self._clipped_peer_rows(model, inputs, update_index) if mode == "train" else None
        keep = peer_loss.gradient_rows(inputs["hacpo_is_peer"], clipped)
        if mode == "train" and self.sharing.skip_empty_updates:  # read by training_step at the end of the update
            has_rows = self._on_any_rank(peer_loss.has_gradient_rows(inputs["hacpo_valid"], clipped))
            self._updates.has_rows = bool(self._updates.has_rows) or has_rows
        rows, logps = keep.nonzero().flatten(), self._row_logps(model, inputs, keep)
        on_policy = self._self_on_policy or mode == "eval"
        out = peer_loss.rows_loss(logps, inputs, rows, update_index, clipped, self.hacpo_loss_config, on_policy)
        stats, peer_ratios = metrics.loss_row_sums(out, rows, inputs, clipped, int(keep.sum()))
        self._log(mode, metrics.loss_metrics(self._summed(stats), out.lower_bound, out.kl))
        if mode != "train":
            return out.loss
        self._collect_peer_ratios(peer_ratios, out.lower_bound)
        return out.loss / ga

    def _collect_peer_ratios(self, ratios: torch.Tensor, lower_bound: float) -> None:
        """Keep every peer row's ratio and bound over a generation batch; after its last update, log their summary
        over the whole batch (all ranks of this agent: a collective)."""
        from accelerate.utils import gather_object

        self._updates.peer_ratios += [(float(r), lower_bound) for r in ratios.tolist()]
        if (self._step + 1) % self._generate_every:
            return
        rows = self._updates.peer_ratios
        rows = gather_object(rows) if self.accelerator.num_processes > 1 else rows
        self._updates.peer_ratios = []
        self._log("train", metrics.peer_ratio_metrics(rows))

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
        self._prepare_seconds, start = 0.0, time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # the update's last micro-batch, as the Trainer counts them
            self._updates.last_skipped = False
            if self.sharing.skip_empty_updates and not self._updates.take_has_rows():
                model.zero_grad(set_to_none=True)  # no row of it had a gradient, on any rank: no optimizer step
                self._update_without_gradients()
        exchange.end_startup()  # downloads, vLLM start-up and the first generation are behind every agent now
        seconds = time.perf_counter() - start - self._prepare_seconds
        self._metrics["train"]["hacpo/time/loss_and_backward"].append(seconds)
        return loss

    def _update_without_gradients(self) -> None:
        """A skipped update, or an empty one (`skip_empty_updates`), leaves every parameter without a gradient: its
        optimizer step must change nothing (:func:`~hacpo_trl.updates.pause_for_no_gradients`)."""
        paused = updates.pause_for_no_gradients(self.accelerator.scaler, self.optimizer)
        if paused is not None:
            self._updates.paused_scaler = paused

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
        """TRL's checkpoint, then the capability tracker written last and atomically: a folder without it was
        interrupted while saving and is never resumed from. ``save_total_limit`` is applied only once every agent
        has completed this step's checkpoint: a crash while any agent saves leaves all the previous step."""
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
