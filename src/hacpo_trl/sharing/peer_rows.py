"""The learner's view of a generation batch: which peer completions it trains on, and how.

Plain functions over this process's self rows and the exchanged :class:`~hacpo_trl.run.exchange.RolloutBatch` records,
so the peer-row pipeline is testable without a trainer or a process group. :func:`build_peer_rows` picks the peer
rows of this process's prompts, computes capability-aware advantages over each prompt's joint group (self and
peer), re-tokenizes the peers' texts with the learner's tokenizer and decides which rows get a loss;
:func:`append_peer_rows` pads them into TRL's batch layout after the self rows. Which peers and prompts enter is
:mod:`hacpo_trl.sharing.decision`'s decision; ``HACPOTrainer`` only glues them in.

``settings`` is the learner's :class:`~hacpo_trl.sharing.settings.SharingSettings` over its config
(:meth:`~hacpo_trl.sharing.settings.SharingSettings.over`; any object with the same attributes will do): it reads the sharing
options ``peer_filter``, ``taught_scale``, ``taught_cap`` and ``taught_baseline``, and the config's ``mask_truncated_completions``,
``max_completion_length``, ``capability_baseline``, ``zero_uniform_groups``, ``max_reward``,
``capability_ratio_min`` and ``capability_ratio_max``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..algorithm import capability_aware_advantages, capability_ratio, peer_row_order
from ..run.exchange import RolloutBatch
from .retokenize import peer_completion_ids

__all__ = [
    "PeerRows",
    "add_self_columns",
    "append_peer_rows",
    "build_peer_rows",
    "learner_records",
    "micro_batches",
    "negative_cap_factor",
    "order_rows",
    "own_rewards",
    "self_prompt_tokens",
    "taught_cap_factor",
]


def own_rewards(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, process_index: int, local_count: int
) -> torch.Tensor:
    """This process's rewards out of TRL's gathered ``rewards_per_func``: weighted and summed over reward functions
    like TRL, NaN where every function is NaN (unscorable), on the CPU."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
    start = process_index * local_count
    return rewards[start : start + local_count].cpu()


def order_rows(batch: dict, n_self: int, steps_per_generation: int, layout: str) -> dict:
    """``batch`` (``n_self`` self rows, then peer rows) in the order of
    :func:`~hacpo_trl.algorithm.peer_row_order`: self rows shuffled among themselves and kept first."""
    order = peer_row_order(n_self, batch["prompt_ids"].shape[0], steps_per_generation, layout)
    return {k: (v[order] if isinstance(v, torch.Tensor) and v.ndim >= 1 else v) for k, v in batch.items()}


def add_self_columns(batch: dict, old_logps: torch.Tensor, rewards: torch.Tensor, eos_token_ids) -> dict:
    """Add HACPO's columns for TRL's self rows to ``batch`` (in place) and return the columns of this process's
    :class:`~hacpo_trl.run.exchange.RolloutBatch`: rewards, each completion's mean old log-prob, token count and whether
    it ended with EOS. A self row is valid when it is non-empty with a finite reward and old log-prob."""
    device = batch["completion_ids"].device
    mask = batch["completion_mask"]
    lengths = mask.sum(-1)
    old_mean = ((old_logps * mask).sum(-1) / lengths.clamp(min=1)).float()
    eos_ids = set(eos_token_ids)
    last = batch["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    terminated = [bool(n > 0 and int(t) in eos_ids) for n, t in zip(lengths.tolist(), last.tolist(), strict=True)]
    n_self = len(rewards)
    batch["hacpo_is_peer"] = torch.zeros(n_self, dtype=torch.bool, device=device)
    batch["hacpo_old_mean_logp"] = old_mean.to(device)
    batch["hacpo_old_len"] = lengths.to(device)
    batch["hacpo_omega"] = torch.ones(n_self, device=device)
    batch["hacpo_valid"] = (lengths > 0) & torch.isfinite(rewards).to(device) & torch.isfinite(old_mean)
    batch["hacpo_taught"] = torch.zeros(n_self, dtype=torch.bool, device=device)
    return {
        "rewards": rewards.tolist(),
        "old_mean_logps": old_mean.cpu().tolist(),
        "num_tokens": lengths.cpu().tolist(),
        "terminated": terminated,
    }


@dataclass
class PeerRows:
    """The peer rows one process appends after its self rows, one entry per row, and why others were left out."""

    prompt_ids: list[str] = field(default_factory=list)  # the prompt each row answers
    sources: list[str] = field(default_factory=list)  # the agent that generated it
    completion_ids: list[list[int]] = field(default_factory=list)  # its completion in the learner's tokens
    advantages: list[float] = field(default_factory=list)
    old_mean_logps: list[float] = field(default_factory=list)  # the generator's, in its own tokenization
    old_lengths: list[int] = field(default_factory=list)  # the generator's token count
    omega: list[float] = field(default_factory=list)  # ω(source, learner), Eq. (8)
    rewards: list[float] = field(default_factory=list)  # the generator's reward for it
    valid: list[bool] = field(default_factory=list)  # gets a loss (False: in the baseline only)
    taught: list[bool] = field(default_factory=list)  # from a peer that teaches this prompt: the bounded weight
    self_advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))  # the self rows' (joint) advantages
    rejected: int = 0  # non-finite reward or old log-prob, or nothing left after re-tokenization
    truncated: int = 0  # cut to max_completion_length in the learner's tokens
    filtered: int = 0  # left out by peer_filter ("correct" or "positive")
    retokenize_seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.completion_ids)


def self_prompt_tokens(prompt_ids: Sequence[str], batch_prompt_ids, batch_prompt_mask) -> dict[str, torch.Tensor]:
    """The learner's own prompt tokens (unpadded, on CPU) for each prompt id of its self rows."""
    first: dict[str, int] = {}
    for i, pid in enumerate(prompt_ids):
        first.setdefault(pid, i)
    return {pid: batch_prompt_ids[i][batch_prompt_mask[i].bool()].cpu() for pid, i in first.items()}


def build_peer_rows(
    prompt_ids: Sequence[str],
    rewards: torch.Tensor | Sequence[float],
    records: Sequence[RolloutBatch],
    learner: str,
    agent_names: Sequence[str],
    capabilities: Mapping[str, float],
    settings,
    tokenizer,
    peer_weight: float = 1.0,
    only_prompts: Mapping[str, Collection[str]] | None = None,
    taught: Collection[str] = (),
    negatives: Mapping[str, Collection[str]] | None = None,
) -> PeerRows:
    """The peer rows for this process's self rows (``prompt_ids`` and ``rewards``, NaN = unscorable).

    Every record of one of these prompts by an agent of ``agent_names`` other than the learner is a candidate (in
    ``agent_names`` order, then record order): pass the learner and the peers it learns from, so that other agents'
    rows and rewards stay out of its joint groups. A candidate with a non-finite reward or old log-prob is rejected.
    Advantages are :func:`~hacpo_trl.algorithm.capability_aware_advantages` over each prompt's joint group of finite
    rewards, self rows included (a self row with a NaN reward gets 0). Then ``peer_filter="correct"`` drops peer rows
    without a positive reward, ``"positive"`` those without a positive advantage (they still count in the baseline),
    and each remaining text is re-tokenized by :func:`~hacpo_trl.sharing.retokenize.peer_completion_ids` (``None``: rejected).

    ``peer_weight`` (the fade of ``peer_fade_steps``) multiplies the peer rows' advantages after the baseline, so their
    objectives too: the peer term is linear in A. A peer named in ``only_prompts`` (the prompts a closed peer rescues)
    enters only those prompts' joint groups, rows and rewards alike. The rows of a peer in ``taught`` are flagged for
    :func:`~hacpo_trl.sharing.peer_loss.taught_weight` instead of the band, their advantages times ``settings.taught_scale``
    (after the filter) and by :func:`taught_cap_factor` (`taught_cap`), and with ``settings.taught_baseline == "own"``
    the learner's rows on their prompts keep the advantages of its own group.

    A peer's prompts in ``negatives`` (`peer_negatives: unsure`) stay out of the joint groups: there its wrong rows
    are taught rows with the mean advantage of the learner's own wrong rows on that prompt, times
    :func:`negative_cap_factor`, and its right rows are left out (``filtered``); the learner's rows keep their own.
    """
    only_prompts, negatives = only_prompts or {}, negatives or {}
    mine = set(prompt_ids)
    out = PeerRows()
    candidates = []  # (pid, source, text, reward, old_mean, old_len, terminated)
    wrong = []  # the same, for the negative rows
    for agent in agent_names:
        if agent == learner:
            continue
        for r in (r for r in records if r.agent == agent):
            for j, pid in enumerate(r.prompt_ids):
                if pid not in mine or (agent in only_prompts and pid not in only_prompts[agent]):
                    continue
                if not (math.isfinite(r.rewards[j]) and math.isfinite(r.old_mean_logps[j])):
                    out.rejected += 1
                    continue
                row = (pid, agent, r.texts[j], r.rewards[j], r.old_mean_logps[j], r.num_tokens[j], r.terminated[j])
                if pid not in negatives.get(agent, ()):
                    candidates.append(row)
                elif r.rewards[j] > 0:
                    out.filtered += 1
                else:
                    wrong.append(row)

    # capability-aware advantages over each joint group (all finite rewards, self and peer)
    joint_rewards, joint_sources, joint_groups, self_index = [], [], [], []
    for i, pid in enumerate(prompt_ids):
        if math.isfinite(float(rewards[i])):
            self_index.append(i)
            joint_rewards.append(float(rewards[i]))
            joint_sources.append(learner)
            joint_groups.append(pid)
    for pid, source, _, reward, *_ in candidates:
        joint_rewards.append(reward)
        joint_sources.append(source)
        joint_groups.append(pid)
    ratio_min, ratio_max = settings.capability_ratio_min, settings.capability_ratio_max
    advantages = _group_advantages(joint_rewards, joint_sources, joint_groups, learner, capabilities, settings)
    out.self_advantages = torch.zeros(len(prompt_ids))
    out.self_advantages[self_index] = advantages[: len(self_index)]
    if settings.taught_baseline == "own":  # own rows on a taught prompt keep their own group's (GSPO's) advantages
        taught_prompts = {pid for pid, source, *_ in candidates if source in taught}
        on_taught = [i for i in self_index if prompt_ids[i] in taught_prompts]
        own, ids = [float(rewards[i]) for i in on_taught], [prompt_ids[i] for i in on_taught]
        out.self_advantages[on_taught] = _group_advantages(
            own, [learner] * len(own), ids, learner, capabilities, settings
        )
    peer_adv = advantages[len(self_index) :] * peer_weight
    taught_scale = settings.taught_scale * taught_cap_factor(records, taught, only_prompts, settings, negatives)
    n_joint = len(candidates)
    if wrong:  # each negative row: the learner's own wrong rows' advantage on its prompt
        own_wrong: dict[str, list[float]] = {}
        for i in self_index:
            if not float(rewards[i]) > 0:
                own_wrong.setdefault(prompt_ids[i], []).append(float(out.self_advantages[i]))
        factor = settings.taught_scale * negative_cap_factor(records, negatives, settings) * peer_weight
        negative_adv = [statistics.fmean(own_wrong.get(row[0], [0.0])) * factor for row in wrong]
        candidates += wrong
        peer_adv = torch.cat([peer_adv, torch.tensor(negative_adv)])

    # re-tokenize the peer rows we train on
    eos = tokenizer.eos_token_id
    start = time.perf_counter()
    for k, ((pid, source, text, reward, old_mean, old_len, term), adv) in enumerate(
        zip(candidates, peer_adv.tolist(), strict=True)
    ):
        negative = k >= n_joint  # already scaled and capped
        dropped = (
            not reward > 0 if settings.peer_filter == "correct" else settings.peer_filter == "positive" and adv <= 0
        )
        if dropped and not negative:
            out.filtered += 1
            continue
        view = peer_completion_ids(tokenizer, text, term, settings.max_completion_length, eos)
        if view is None:
            out.rejected += 1
            continue
        out.truncated += view.truncated
        # With mask_truncated_completions, a completion the generator did not finish (no EOS: TRL zeroed its mask,
        # so the record holds 0 tokens and old log-prob 0) or that this learner had to cut is masked like TRL
        # masks its own truncated rows: it stays in the baseline but gets no loss. A record with no generator
        # tokens has no old log-prob to form a ratio with, in any mode.
        cut = view.truncated or not term
        out.prompt_ids.append(pid)
        out.sources.append(source)
        out.completion_ids.append(view.ids)
        out.advantages.append(adv if negative else adv * taught_scale if source in taught else adv)
        out.old_mean_logps.append(old_mean)
        out.old_lengths.append(old_len)
        out.omega.append(capability_ratio(capabilities[source], capabilities[learner], ratio_min, ratio_max))
        out.rewards.append(reward)
        out.valid.append(not (cut and settings.mask_truncated_completions) and old_len > 0)
        out.taught.append(source in taught or negative)
    out.retokenize_seconds = time.perf_counter() - start
    return out


def taught_cap_factor(
    records: Sequence[RolloutBatch],
    taught: Collection[str],
    only_prompts: Mapping[str, Collection[str]],
    settings,
    negatives: Mapping[str, Collection[str]] | None = None,
) -> float:
    """The factor `taught_cap` K puts on every taught row's advantage: min(1, K / n), n the taught rows of the
    generation batch, so that together they weigh at most K rows' worth while a few keep their full weight. n counts,
    over every rank's ``records`` (the same on each rank of the learner), the rows of the ``taught`` peers on their
    prompts (``only_prompts``) with a finite reward and old log-prob that `peer_filter` keeps ('correct': a positive
    reward), before re-tokenization and `taught_ratio_floor`; a peer's ``negatives`` prompts are left out
    (:func:`negative_cap_factor` caps those). ``settings.taught_cap`` 0: no cap (1)."""
    cap, negatives = settings.taught_cap, negatives or {}
    if not cap:
        return 1.0
    n = 0
    for r in records:
        if r.agent in taught:
            for pid, reward, old in zip(r.prompt_ids, r.rewards, r.old_mean_logps, strict=True):
                kept = settings.peer_filter != "correct" or reward > 0
                on = (r.agent not in only_prompts or pid in only_prompts[r.agent]) and pid not in negatives.get(
                    r.agent, ()
                )
                n += on and kept and math.isfinite(reward) and math.isfinite(old)
    return min(1.0, cap / n) if n else 1.0


def negative_cap_factor(records: Sequence[RolloutBatch], negatives: Mapping[str, Collection[str]], settings) -> float:
    """`taught_cap` K on the negative rows (`peer_negatives`): min(1, K / n), n the wrong rows (a finite reward, not
    positive, and a finite old log-prob) of each peer on its ``negatives`` prompts over every rank's ``records``,
    before re-tokenization and `taught_ratio_floor`, so that together they weigh at most K rows' worth, apart from
    the correct taught rows. K 0: no cap (1)."""
    cap = settings.taught_cap
    if not cap:
        return 1.0
    n = 0
    for r in records:
        for pid, reward, old in zip(r.prompt_ids, r.rewards, r.old_mean_logps, strict=True):
            on = pid in negatives.get(r.agent, ())
            n += on and math.isfinite(reward) and not reward > 0 and math.isfinite(old)
    return min(1.0, cap / n) if n else 1.0


def _group_advantages(
    rewards: list[float], sources: list[str], groups: list[str], learner: str, capabilities, settings
) -> torch.Tensor:
    """:func:`~hacpo_trl.algorithm.capability_aware_advantages` over each group of ``rewards``. A group left with one
    finite reward (its other rows unscorable or rejected) has no spread to learn from: its row gets advantage 0, as
    TRL gives a group whose std is 0, instead of stopping the run."""
    sizes = Counter(groups)
    usable = [k for k, gid in enumerate(groups) if sizes[gid] > 1]
    advantages = torch.zeros(len(rewards))
    if usable:
        advantages[usable] = capability_aware_advantages(
            [rewards[k] for k in usable],
            [sources[k] for k in usable],
            [groups[k] for k in usable],
            learner,
            capabilities,
            capability_weighting=settings.capability_baseline,
            zero_uniform_groups=settings.zero_uniform_groups,
            max_reward=settings.max_reward,
            min_ratio=settings.capability_ratio_min,
            max_ratio=settings.capability_ratio_max,
        ).float()
    return advantages


def _pad_rows(rows: list[torch.Tensor], value: float, side: str, width: int | None = None) -> torch.Tensor:
    width = max([width or 0] + [r.shape[0] for r in rows])
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        if side == "left":
            out[i, width - r.shape[0] :] = r
        else:
            out[i, : r.shape[0]] = r
    return out


def append_peer_rows(
    batch: dict,
    rows: PeerRows,
    prompt_tokens: Mapping[str, torch.Tensor],
    self_prompt_ids: Sequence[str],
    steps_per_generation: int,
    pad_id: int,
) -> dict:
    """``batch`` (TRL's self rows plus the ``hacpo_*`` columns) with ``rows`` appended in the same layout.

    Peer prompts are the learner's own prompt tokens (``prompt_tokens``, left-padded), completions right-padded;
    columns widen to the longer completion. Padding rows (invalid, advantage 0) make the row count divisible by
    ``steps_per_generation`` so TRL can split the batch. ``advantages`` become the joint ones of ``rows``.
    """
    device = batch["completion_ids"].device
    n_self = len(self_prompt_ids)
    n_peer = len(rows)
    n_pad = (-(n_self + n_peer)) % steps_per_generation
    width_p = batch["prompt_ids"].shape[1]
    peer_prompt = [prompt_tokens[pid] for pid in rows.prompt_ids] + [prompt_tokens[self_prompt_ids[0]]] * n_pad
    peer_completion = [torch.tensor(ids) for ids in rows.completion_ids] + [torch.tensor([pad_id])] * n_pad
    total = n_peer + n_pad
    if total:
        p_ids = _pad_rows(peer_prompt, pad_id, "left", width_p)
        p_mask = _pad_rows([torch.ones_like(t) for t in peer_prompt], 0, "left", width_p)
        c_ids = _pad_rows(peer_completion, pad_id, "right")
        c_mask = _pad_rows([torch.ones_like(t) for t in peer_completion], 0, "right")
        width_c = max(c_ids.shape[1], batch["completion_ids"].shape[1])

        def widen(t: torch.Tensor, value) -> torch.Tensor:
            if t.shape[1] == width_c:
                return t
            extra = torch.full((t.shape[0], width_c - t.shape[1]), value, dtype=t.dtype, device=t.device)
            return torch.cat([t, extra], dim=1)

        batch["prompt_ids"] = torch.cat([batch["prompt_ids"], p_ids.to(device)])
        batch["prompt_mask"] = torch.cat([batch["prompt_mask"], p_mask.to(device)])
        batch["completion_ids"] = torch.cat([widen(batch["completion_ids"], pad_id), widen(c_ids, pad_id).to(device)])
        batch["completion_mask"] = torch.cat([widen(batch["completion_mask"], 0), widen(c_mask, 0).to(device)])
        if "ref_per_token_logps" in batch:
            ref = widen(batch["ref_per_token_logps"], 0.0)
            batch["ref_per_token_logps"] = torch.cat([ref, torch.zeros(total, width_c, dtype=ref.dtype, device=device)])
        if "importance_sampling_ratio" in batch:
            ratio = batch["importance_sampling_ratio"]
            if ratio.dim() == 2 and ratio.shape[1] > 1:
                ratio = widen(ratio, 1.0)
            filler = torch.ones(total, *ratio.shape[1:], dtype=ratio.dtype, device=device)
            batch["importance_sampling_ratio"] = torch.cat([ratio, filler])

    def column(values, dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    def append(key: str, values: list, filler, dtype) -> None:
        batch[key] = torch.cat([batch[key], column(values + [filler] * n_pad, dtype)])

    batch["advantages"] = torch.cat(
        [rows.self_advantages.to(device), column(rows.advantages + [0.0] * n_pad, torch.float32)]
    )
    batch["hacpo_is_peer"] = torch.cat([batch["hacpo_is_peer"], column([True] * total, torch.bool)])
    append("hacpo_old_mean_logp", rows.old_mean_logps, 0.0, torch.float32)
    append("hacpo_old_len", rows.old_lengths, 1, torch.long)
    append("hacpo_omega", rows.omega, 1.0, torch.float32)
    append("hacpo_valid", rows.valid, False, torch.bool)
    batch.setdefault("hacpo_taught", torch.zeros(n_self, dtype=torch.bool, device=device))  # a batch built by hand
    append("hacpo_taught", rows.taught, False, torch.bool)
    return batch


def learner_records(
    by_agent: Mapping[str, Sequence[RolloutBatch]], learner: str, agent_names: Sequence[str], peers: Sequence[str]
) -> tuple[list[RolloutBatch], list[str]]:
    """What enters a learner's peer rows from ``peers`` (:func:`build_peer_rows`'s ``records`` and ``agent_names``):
    the records of the learner and these peers only, their rewards included (the baseline), in ``by_agent``'s order;
    and those agents in ``agent_names`` order (the learner's view)."""
    kept = {agent: by_agent[agent] for agent in (learner, *peers) if agent in by_agent}
    return [r for records in kept.values() for r in records], [a for a in agent_names if a in kept]


def micro_batches(batch: dict, plan, settings) -> list[dict | None]:
    """A generation batch cut into the micro-batches its plan (:class:`~hacpo_trl.run.schedule.BatchPlan`) trains, those
    it skips None. A solo batch is shuffled as TRL shuffles it. With peer rows, self and peer rows are shuffled apart
    and self rows kept first (:func:`order_rows`, by ``settings.peer_layout``), so that the stepwise peer bound sees
    peer rows in the later updates of a generation batch, as in the paper; a batch of rescued rows only is
    interleaved, so each of its micro-batches holds GSPO's share of the own rows. ``settings.group_by_length`` then
    regroups rows by length within each update (:func:`hacpo_trl.run.padding.group_by_length`)."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    from ..run.padding import group_by_length

    steps = plan.micro_batches
    if plan.solo:  # own rows only, trained with TRL's own loss
        batch = shuffle_sequence_dict(batch)  # exactly TRL's order when there are no peer rows
    else:
        batch = order_rows(batch, plan.own_rows, steps, "interleaved" if plan.few_prompts else settings.peer_layout)
    if settings.group_by_length:
        batch = group_by_length(batch, steps, settings.gradient_accumulation_steps, settings.share_rollouts)
    return split_tensor_dict(batch, steps) + [None] * (plan.steps_per_generation - steps)
