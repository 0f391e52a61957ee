"""One learner's sharing settings: each declared once (:class:`SharingFields`: name, type, default, help and doc)
and checked once (:class:`SharingSettings`, the per-learner object the trainer, peer rows, peer loss, probe and plan
read).

Standard library only, so that ``--plan`` and the checks before any ML library loads read the same object as
training; :mod:`hacpo_trl.sharing.decision` (the decision at each generation batch) re-exports every name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

from .presets import SHARING_PRESETS

_PAPER = SHARING_PRESETS["paper"]  # each setting's default: the paper's rule (`hacpo_trl.sharing.presets`)

__all__ = [
    "LEARNER_SETTINGS",
    "PEER_FILTERS",
    "PEER_LIMITS",
    "PEER_NEGATIVES",
    "PEER_PROMPTS",
    "RUN_WIDE_SETTINGS",
    "TAUGHT_BASELINES",
    "TAUGHT_SCHEDULES",
    "SharingFields",
    "SharingSettings",
    "parse_learn_from",
]

PEER_FILTERS = ("all", "correct", "positive")
PEER_PROMPTS = ("all", "better", "failed")
PEER_NEGATIVES = ("none", "unsure")
TAUGHT_SCHEDULES = ("sharing", "solo")
TAUGHT_BASELINES = ("joint", "own")

# Sharing settings every agent must hold equal (unlike a learner's own choices): every agent exchanges at every
# generation batch, and every learner must compute every agent's P̂ alike.
RUN_WIDE_SETTINGS = ("share_rollouts", "capability_window", "capability_metric")


def parse_learn_from(value: Any, agent_names: list[str], where: str = "`learn_from`") -> list[str] | None:
    """``learn_from`` as the list of agents named (``None``: all). Accepts ``"all"``, ``"none"``, a comma-separated
    string of names or a list of names; a name that is not an agent of the run is an error naming it."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, str) and value.strip().lower() == "none":
        return []
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
        if not names:
            raise ValueError(f"{where} must be 'all', 'none' or agent names, got {value!r}")
    elif isinstance(value, list | tuple) and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        raise ValueError(f"{where} must be 'all', 'none' or a list of agent names, got {value!r}")
    unknown = [n for n in names if n not in agent_names]
    if unknown:
        raise ValueError(f"{where} names unknown agent(s) {unknown}; the run's agents are {agent_names}")
    return names


def _shown(value: Any) -> str:
    """A setting's value as a recipe writes it (1 for 1.0, 'solo' quoted)."""
    return repr(value) if isinstance(value, str) else format(value, "g")


def _true_or_false(value: Any, name: str, who: str) -> bool:
    """A boolean setting, refused by name when a recipe gives anything else (YAML's `yes`, 1, ...)."""
    if not isinstance(value, bool):
        raise ValueError(f"{who}`{name}` must be true or false, got {value!r}")
    return value


@dataclass(repr=False, eq=False)
class SharingFields:
    r"""
    One learner's sharing settings as fields of a config, declared here and nowhere else: `HACPOConfig` inherits them
    (its docstring points here; `make docs` writes both into docs/options.md) and :class:`SharingSettings` takes them
    with the paper's defaults. A field that is None here is filled in by the run's `sharing` mode
    (:mod:`hacpo_trl.sharing.presets`). Each may differ per agent (an agent's `overrides`). A field's metadata is only what
    the argument parser takes (its ``help``).

    Parameters:
        peer_filter (`str`, *optional*, defaults to `"all"`):
            Which peer completions a learner trains on: `"all"`, `"correct"` (reward > 0) or `"positive"` (advantage
            > 0 for the learner: F-TIS's dropping of off-policy rows with negative advantage, which also drops
            zero-advantage rows; with 0/1 rewards it is `"correct"` without the correct rows of all-correct
            groups, which carry no signal). Baselines always use the whole joint group of the peers it learns
            from. May differ per agent (`overrides`).
        learn_from (`str` or `list[str]`, *optional*, defaults to `"all"`):
            Whom a learner learns from: `"all"` other agents, `"none"`, or agent names (a YAML list or `"a,b"`; the
            learner's own name is ignored, so a run-wide `learn_from: [teacher]` makes every other agent learn from
            `teacher` and `teacher` from no one). Per agent: the `AgentSpec` field `learn_from`. Every agent still
            shares its own rollouts with all the others: one learner's choice never changes what another receives.
            A peer not learned from is left out entirely, its rewards included (they do not enter the baseline). A
            learner with no peer to learn from at a generation batch trains on that batch exactly as GSPO
            (`share_rollouts: false`, TRL's `GRPOTrainer`) does with the same schedule: the same
            `per_device_train_batch_size`, `steps_per_generation` and `gradient_accumulation_steps`, hence the same
            rows per optimizer update and updates per generation batch (its own rows split into
            `steps_per_generation` mini-batches; with the paper's sharing schedule, 4 updates of 16 rows instead of
            GSPO's 2 of 32 at `steps_per_generation: 2`). Its advantages are TRL's own group-normalised ones.
        capability_gate (`float`, *optional*, defaults to `0.0`):
            Learn from a peer j only while its capability P̂_j is at least `capability_gate` x the learner's P̂_k,
            checked at every generation batch with P̂ updated by that batch's rewards (the P̂ of the logs and of
            ω), so sharing switches itself on and off as capabilities cross during training: `1.0`
            learns only from peers at least as capable, `0.8` also from peers up to 20% weaker; `0` keeps every peer
            of `learn_from` open. A learner with every peer gated off trains as with `learn_from: none` (GSPO).
            Logged as `hacpo/learns_from/<peer>` (1 open, 0 closed). May differ per agent (`overrides`).
        capability_gate_warmup (`int`, *optional*, defaults to `0`):
            With `capability_gate` > 0, keep every peer closed for this learner's first N generation batches: P̂
            from a batch or two is too noisy to rank agents by, and one early batch of a weaker peer's rows can
            cost a stronger learner (seen on the validation split). `capability_window` (the paper's 5) waits for
            a full window. Refused without a gate. May differ per agent (`overrides`).
        capability_gate_confidence (`float`, *optional*, defaults to `0.0`):
            With `capability_gate` > 0, open a peer only when the capability windows show P̂_j >= gate x P̂_k at
            this one-sided confidence (`0.95`: a z-test on the windows' accuracies, each P̂ over the completions of
            its `capability_window`; :func:`~hacpo_trl.sharing.decision.gate_evidence`), instead of on the point estimates
            alone: a clearly stronger peer opens at the first batch, two agents whose P̂ are within noise of each
            other stay closed. An alternative to a fixed `capability_gate_warmup`. `0` = off; otherwise in [0.5,
            1). Refused without a gate or with `capability_metric: mean_reward`. Logged as `hacpo/gate_z/<peer>`.
            Not in the paper. May differ per agent (`overrides`).
        peer_prompts (`str`, *optional*, defaults to `"all"`):
            On which prompts a learner takes an open peer's rows: `"all"`, or `"better"`: only on the prompts of the
            generation batch where that peer's success rate (share of its completions with a positive reward, over
            all ranks) is above the learner's own; ties (both failed, both solved, equal rates) keep nothing. On
            those prompts the peer's rows enter the joint group and are *taught* rows: instead of the band they get
            the bounded weight (1 + γ)·s / (s + γ) ≤ 1, γ = 0.1 (LUFFY's shaping, 0.92 at s = 0.5), with the gradient
            of log s, so a trace the learner finds unlikely still teaches (the band would drop it). Decided per
            prompt, whatever the overall P̂: agents each better on part of a task teach each other that part, and
            a stronger learner takes a weaker peer's rows only where the peer did better. Combines with
            `peer_filter`, `learn_from` and the capability gate (a closed peer stays closed); `band_gate` closes a
            taught peer none of whose rows is at or above `taught_ratio_floor`. A batch where no peer does better on
            any prompt is learned from no one (`solo_steps_per_generation`). `"failed"`: the same, on the prompts the
            learner failed at every completion and the peer solved at least once (the prompts where GSPO has no
            signal), so a prompt the learner solves sometimes is trained as GSPO trains it. Logged as
            `hacpo/taught_prompts/<peer>` (share of the batch's prompts). Not in the paper. May differ per agent
            (`overrides`).
        taught_ratio_floor (`float`, *optional*, defaults to `0.2`):
            With `peer_prompts` 'better' or 'failed', a taught row whose ratio s is below this floor gets no gradient
            (it skips the backward pass like a row outside the band): the guard against a peer that writes in a format
            the learner cannot produce, whose correct traces would otherwise teach that format. On the benchmark's
            validation runs without a floor, the taught rows' geometric-mean s per batch was 0.006–0.09 where the peer
            writes another format (`style`, until the learner began to write it), 0.48–0.91 where the peer knows the
            half of the task the learner does not (`complement`), 0.6–1.1 in `state` and `model`. `0` keeps every taught
            row. In [0, 1). Not in the paper. May differ per agent (`overrides`).
        taught_schedule (`str`, *optional*, defaults to `"sharing"`):
            With `peer_prompts` 'better' or 'failed', how a generation batch with taught rows is cut into updates:
            `"sharing"`, the paper's schedule (`steps_per_generation` updates, own rows first), or `"solo"`: the
            schedule of a batch learned from no one (`solo_steps_per_generation` updates), own and taught rows
            interleaved, as a batch of rescued rows (`capability_gate_rescue`). A few taught rows then add to GSPO's
            updates instead of doubling their number: with `solo_steps_per_generation: 2` a learner makes GSPO's 2
            updates of 32 own rows whether or not a peer taught it. Without `solo_steps_per_generation` (the
            `recommended` preset) no update is skipped: every batch is cut into the recipe's `steps_per_generation`
            updates, as GSPO cuts it, and a batch's taught rows are interleaved into them, so a GSPO recipe keeps
            GSPO's optimizer steps. Not in the paper. May differ per agent (`overrides`).
        taught_baseline (`str`, *optional*, defaults to `"joint"`):
            With `peer_prompts` 'better' or 'failed', the advantages of the learner's own rows on a taught prompt:
            `"joint"`, the capability-aware baseline over the joint group (Eq. 5; the peer's correct rewards raise it,
            so on a prompt the learner failed entirely each of its own rows gets a negative advantage, where GSPO
            gives 0), or `"own"`: its own group's, as GSPO computes them, so a taught prompt adds the peer's rows and
            changes nothing of the learner's own. The taught rows' advantages stay the joint group's. On the
            benchmark's validation runs `"own"` did not keep a learner's solved half (rule 15). Not in the paper. May
            differ per agent (`overrides`).
        taught_scale (`float`, *optional*, defaults to `1.0`):
            With `peer_prompts` 'better' or 'failed', a factor on the taught rows' advantages (so on their
            objectives: the taught term is linear in A), in (0, 1]: what taught rows weigh in an update against the
            learner's own rows, where a peer's traces on one part of a task can cost the learner another part (the
            `complement` pair's `trace-carry` on its own half). `1`: full weight (the recommended preset, whose
            `taught_cap` damps many rows instead); 0.25 is the `quarter_weight` preset (the benchmark's rule 16: a
            learner's weak half gained as much at 0.25 as at 1, its solved half lost a sixth as much). Not in the
            paper. May differ per agent (`overrides`).
        taught_cap (`float`, *optional*, defaults to `0`):
            With `peer_prompts` 'better' or 'failed', a limit on the taught rows' share of an update: the n taught
            rows of a generation batch (over all ranks, those `peer_filter` keeps, counted before
            `taught_ratio_floor`) together weigh at most this many rows' worth, each one's advantage times
            min(1, taught_cap / n), after `taught_scale`. A few rows keep their full weight, many are damped: a
            stronger learner is taught about 2 rows per taught batch, `trace-carry` 12.7 (benchmark rule 17). `0`:
            no cap; the recommended preset 3. Not with `peer_filter: positive` (which picks rows by advantage). Not
            in the paper. May differ per agent (`overrides`).
        taught_failed_rate (`float`, *optional*, defaults to `0`):
            With `peer_prompts: failed`, the learner's success rate on a prompt (positive rewards over its scored
            completions, all ranks) at or below which the prompt counts as failed: `0`, failed at every completion;
            `0.125` (the recommended preset), at most one success in 8 (its own group then has a signal, which the
            peer's rows join). The floor and the band gate act as before. In [0, 1). Not in the paper. May differ
            per agent (`overrides`).
        peer_negatives (`str`, *optional*, defaults to `"none"`):
            With `peer_prompts: failed`, `"unsure"` also takes each peer's *wrong* rows on the prompts the learner
            solved more often than `taught_failed_rate` but not always (2 to 7 of 8 at 0.125), as negative taught
            rows: each one's advantage is the one the learner's own wrong rows have there in its own group (GSPO's),
            times min(1, taught_cap / n) over the batch's n such rows (counted apart from the correct taught rows;
            `taught_cap: 0`, no cap);
            the learner's own rows there keep GSPO's advantages and the peer's right rows there are not used. With
            the ratio floor, only wrong answers the learner finds plausible push. Benchmark rule 20's candidate, which
            did not replace the preset: on validation it left the three stronger agents within noise of GSPO. Not in
            the paper. May differ per agent (`overrides`).
        capability_gate_rescue (`bool`, *optional*, defaults to `False`):
            With `capability_gate` > 0, a peer the gate keeps closed still lends its rows on the prompts this learner
            failed at every completion (none with a positive reward, over all its ranks) and the peer solved at least
            once: on those prompts it is treated as open (its rows enter the joint group, `peer_filter` picks which
            are trained on), on every other prompt it stays out. Where GSPO has no signal at all (a group of
            failures has advantage 0) the learner sees a solution, and nothing else it trains on changes: the
            rescue for a stronger learner that the gate protects from a weaker peer (the weaker one often solves
            some of the prompts the stronger fails, e.g. a smaller model that decodes better). A generation batch
            with rescued prompts only keeps the schedule of a batch learned from no one
            (`solo_steps_per_generation`). Peers outside `learn_from` or faded out are never rescued from. Logged as
            `hacpo/rescued_prompts/<peer>` (prompts of the batch, all ranks). Not in the paper (a failed group
            guided by another model's solution: "adaptive guidance" in the RL-for-reasoning literature). Refused
            without a gate. May differ per agent (`overrides`).
        band_gate (`bool`, *optional*, defaults to `False`):
            Also close a peer at a generation batch when none of its rows (after `peer_filter`) lies in the band
            [lb_0, 1] under the learner before the batch's first update: such a peer gives no gradient (every row
            is clamped), yet without the gate its rewards still enter the capability-aware baseline and shift the
            learner's own advantages. A learner with every peer closed trains as GSPO (see `learn_from`). Costs one
            forward without gradient over the peer rows per generation batch. Not in the paper; needs the band
            (not with `naive` or `peer_clipping: false`). A taught row (`peer_prompts: better`) has no band and
            counts when its ratio is at or above `taught_ratio_floor`. Logged as `hacpo/band_rows/<peer>` (rows
            that count, over the agent's ranks). May differ per agent.
        peer_fade_steps (`int`, *optional*, defaults to `0`):
            Fade the learner's peer rows out over training (S2L-PO's annealing back to on-policy data): at a
            generation batch starting after t optimizer steps, the peer rows' advantages (hence their objectives)
            are multiplied by max(0, 1 - t / peer_fade_steps); once that is 0 the learner learns from no one and
            trains as GSPO (see `learn_from`). `0`: no fade. Logged as `hacpo/peer_weight`. May differ per agent.
        solo_steps_per_generation (`int`, *optional*):
            Optimizer updates a learner makes over its own rows at a generation batch where it learns from no one
            (`learn_from: none`, every peer gated off, or faded out), instead of `steps_per_generation`; the
            batch's remaining updates are skipped (no forward, no backward, no optimizer step: AdamW leaves a
            parameter without a gradient untouched). The paper's schedule fixes the *mini-batch size* (the official
            code's `ppo_mini_batch_size`), so the number of updates follows the rows: with one peer, 4 updates of
            16 own + 16 peer rows when sharing, and `2` here gives 2 updates of 32 own rows when not, which is GSPO
            with the paper's schedule exactly (TRL's `GRPOTrainer`, `steps_per_generation: 2`, 32 rows), bit for
            bit: old log-probs are then computed in chunks of 32 rows (also at batches with peers, where only the
            learner's own rows' rounding changes) and a batch without peer rows is trained with TRL's loss. `None`
            (default): `steps_per_generation` updates of fewer rows (the same hyperparameters as GSPO, not the
            same updates). Must divide `steps_per_generation` and be a multiple of `gradient_accumulation_steps`.
            May differ per agent (`overrides`).
        skip_empty_updates (`bool`, *optional*, defaults to `False`):
            An optimizer update in which no row of any of the agent's ranks has a gradient (every peer row outside
            the band or filtered out, no own row) takes no optimizer step. Otherwise AdamW still moves every weight
            on a zero gradient, by its momentum (and weight decay): with the self-first layout, a learner whose
            peer rows all fall outside the band (an off-style peer) makes two such steps per generation batch, which
            GSPO does not. The official code steps on every mini-batch, so this is a deviation, off by default.
            Not with DeepSpeed (its step runs inside the backward call, before the update's rows are known).
            May differ per agent.
    """

    peer_filter: str | None = field(
        default=None, metadata={"help": "Peer rows to train on: 'all', 'correct' or 'positive' (advantage)."}
    )
    learn_from: str = field(
        default="all", metadata={"help": "Whom each agent learns from: 'all', 'none' or agent names 'a,b'."}
    )
    capability_gate: float | None = field(
        default=None, metadata={"help": "Learn from a peer only while P̂_peer >= gate x P̂_learner; 0 = always."}
    )
    capability_gate_warmup: int = field(
        default=0, metadata={"help": "With a gate: every peer closed for the first N generation batches."}
    )
    capability_gate_confidence: float | None = field(
        default=None,
        metadata={"help": "With a gate: open a peer only when P̂_peer >= gate x P̂_learner at this confidence; 0 = off."},
    )
    capability_gate_rescue: bool = field(
        default=False,
        metadata={"help": "With a gate: a closed peer still lends its rows on prompts the learner failed entirely."},
    )
    peer_fade_steps: int = field(
        default=0, metadata={"help": "Fade the peer rows' weight linearly to 0 over this many steps; 0 = no fade."}
    )
    solo_steps_per_generation: int | None = field(
        default=None,
        metadata={"help": "Updates over own rows at a batch learned from no one (rest skipped); None = all."},
    )
    skip_empty_updates: bool = field(
        default=False, metadata={"help": "No optimizer step for an update without a row that has a gradient."}
    )
    band_gate: bool | None = field(
        default=None, metadata={"help": "Learn from a peer only at batches where some of its rows are in the band."}
    )
    peer_prompts: str | None = field(
        default=None,
        metadata={"help": "'all'; 'better' / 'failed': a peer's rows only where it did better / the learner failed."},
    )
    taught_ratio_floor: float | None = field(
        default=None, metadata={"help": "With per-prompt sharing: taught rows with ratio below this get no gradient."}
    )
    taught_schedule: str | None = field(
        default=None,
        metadata={"help": "With per-prompt sharing: 'solo': taught rows join the solo (or the recipe's) updates."},
    )
    taught_baseline: str = field(
        default="joint",
        metadata={"help": "With per-prompt sharing: 'own': a learner's rows on taught prompts keep GSPO's advantages."},
    )
    taught_scale: float | None = field(
        default=None, metadata={"help": "With per-prompt sharing: a factor in (0, 1] on the taught rows' advantages."}
    )
    taught_cap: float | None = field(
        default=None, metadata={"help": "With per-prompt sharing: the taught rows of a batch weigh at most N rows."}
    )
    taught_failed_rate: float | None = field(
        default=None,
        metadata={"help": "With peer_prompts 'failed': a prompt solved at most this often counts as failed."},
    )
    peer_negatives: str = field(
        default="none",
        metadata={"help": "With peer_prompts 'failed': 'unsure': peer wrong rows as negatives where unsure."},
    )


def _learner_fields(cls: type) -> type:
    """``cls`` with a field per field of :class:`SharingFields`, before its own (init-only) ones: the same name, type
    and metadata, its default the paper's rule (:mod:`hacpo_trl.sharing.presets`) where the config's is left to the mode."""
    own = cls.__dict__.get("__annotations__", {})
    cls.__annotations__ = {**{f.name: f.type for f in fields(SharingFields)}, **own}
    for f in fields(SharingFields):
        setattr(cls, f.name, field(default=_PAPER.get(f.name, f.default), metadata=f.metadata))
    return cls


@dataclass(frozen=True)
@_learner_fields
class SharingSettings:
    """One learner's sharing options (the fields of :class:`SharingFields`, documented there), checked when
    made. Each may differ per agent. ``learn_from`` is checked against the run's agents by :func:`parse_learn_from`
    and ``solo_steps_per_generation`` against the schedule by :func:`hacpo_trl.run.schedule.solo_fits`, where those
    are known. The init-only ``capability_metric`` and ``band`` (whether the loss has a peer band) are the
    context some options need; ``who`` prefixes every error (e.g. ``"agent 'a': "``)."""

    capability_metric: InitVar[str] = "accuracy"
    band: InitVar[bool] = True
    who: InitVar[str] = ""

    def __post_init__(self, capability_metric: str, band: bool, who: str) -> None:
        if self.peer_filter not in PEER_FILTERS:
            raise ValueError(f"{who}`peer_filter` must be one of {PEER_FILTERS}, got {self.peer_filter!r}")
        gate = self.capability_gate
        if isinstance(gate, bool) or not (isinstance(gate, int | float) and math.isfinite(gate) and gate >= 0):
            raise ValueError(f"{who}`capability_gate` must be a finite number >= 0, got {gate!r}")
        warmup = self.capability_gate_warmup
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"{who}`capability_gate_warmup` must be an integer >= 0, got {warmup!r}")
        if warmup and not gate:
            raise ValueError(
                f"{who}`capability_gate_warmup` keeps the capability gate closed for the first {warmup} generation "
                "batches, and `capability_gate` is 0 (no gate): set capability_gate > 0 or the warm-up to 0"
            )
        confidence = self.capability_gate_confidence
        if isinstance(confidence, bool) or not (
            isinstance(confidence, int | float) and (confidence == 0 or 0.5 <= confidence < 1)
        ):
            raise ValueError(f"{who}`capability_gate_confidence` must be 0 (off) or in [0.5, 1), got {confidence!r}")
        if confidence and not gate:
            raise ValueError(
                f"{who}`capability_gate_confidence` asks the capability gate for evidence, and `capability_gate` is 0 "
                "(no gate): set capability_gate > 0 or the confidence to 0"
            )
        if confidence and capability_metric == "mean_reward":
            raise ValueError(
                f"{who}`capability_gate_confidence` tests accuracies (P̂ in [0, 1], variance P̂(1 - P̂)), and "
                "`capability_metric` is 'mean_reward': use capability_metric 'accuracy' or the confidence 0"
            )
        if _true_or_false(self.capability_gate_rescue, "capability_gate_rescue", who) and not gate:
            raise ValueError(
                f"{who}`capability_gate_rescue` lends a peer that the capability gate closed, and `capability_gate` "
                "is 0 (no gate, no peer closed by it): set capability_gate > 0 or capability_gate_rescue false"
            )
        if _true_or_false(self.band_gate, "band_gate", who) and not band:
            raise ValueError(
                f"{who}`band_gate` closes a peer none of whose rows is in the band, and with `naive: true` or "
                "`peer_clipping: false` there is no band: set band_gate false"
            )
        fade = self.peer_fade_steps
        if isinstance(fade, bool) or not isinstance(fade, int) or fade < 0:
            raise ValueError(f"{who}`peer_fade_steps` must be an integer >= 0, got {fade!r}")
        if self.peer_prompts not in PEER_PROMPTS:
            raise ValueError(f"{who}`peer_prompts` must be one of {PEER_PROMPTS}, got {self.peer_prompts!r}")
        floor = self.taught_ratio_floor
        if isinstance(floor, bool) or not (isinstance(floor, int | float) and 0 <= floor < 1):
            raise ValueError(f"{who}`taught_ratio_floor` must be a number in [0, 1), got {floor!r}")
        if self.taught_schedule not in TAUGHT_SCHEDULES:
            raise ValueError(f"{who}`taught_schedule` must be one of {TAUGHT_SCHEDULES}, got {self.taught_schedule!r}")
        if self.taught_baseline not in TAUGHT_BASELINES:
            raise ValueError(f"{who}`taught_baseline` must be one of {TAUGHT_BASELINES}, got {self.taught_baseline!r}")
        scale = self.taught_scale
        if isinstance(scale, bool) or not (isinstance(scale, int | float) and 0 < scale <= 1):
            raise ValueError(f"{who}`taught_scale` must be a number in (0, 1], got {scale!r}")
        cap = self.taught_cap
        if isinstance(cap, bool) or not (isinstance(cap, int | float) and math.isfinite(cap) and cap >= 0):
            raise ValueError(f"{who}`taught_cap` must be a finite number >= 0 (0: no cap), got {cap!r}")
        if cap and self.peer_filter == "positive":
            raise ValueError(
                f"{who}`taught_cap` counts a batch's taught rows before their advantages, and `peer_filter: positive` "
                "picks rows by advantage: set peer_filter 'correct' or 'all', or taught_cap 0"
            )
        rate = self.taught_failed_rate
        if isinstance(rate, bool) or not (isinstance(rate, int | float) and 0 <= rate < 1):
            raise ValueError(f"{who}`taught_failed_rate` must be a number in [0, 1), got {rate!r}")
        if rate and self.peer_prompts != "failed":
            raise ValueError(
                f"{who}`taught_failed_rate` widens `peer_prompts: failed`, and `peer_prompts` is "
                f"{self.peer_prompts!r}: set peer_prompts 'failed', or taught_failed_rate 0"
            )
        if self.peer_negatives not in PEER_NEGATIVES:
            raise ValueError(f"{who}`peer_negatives` must be one of {PEER_NEGATIVES}, got {self.peer_negatives!r}")
        if self.peer_negatives != "none" and self.peer_prompts != "failed":
            raise ValueError(
                f"{who}`peer_negatives: {self.peer_negatives}` adds negative taught rows beside `peer_prompts: failed`'s, "
                f"and `peer_prompts` is {self.peer_prompts!r}: set peer_prompts 'failed', or peer_negatives 'none'"
            )
        if self.capability_gate_rescue and self.peer_prompts == "failed":
            raise ValueError(
                f"{who}`capability_gate_rescue` lends a closed peer's rows on the prompts the learner failed entirely, "
                "and `peer_prompts: failed` already takes every peer's rows there (as taught rows): set "
                "capability_gate_rescue false, or peer_prompts 'all' to keep the rescue"
            )
        if self.peer_prompts == "all":  # these act on taught rows, which only per-prompt sharing makes
            taught = ("taught_ratio_floor", "taught_schedule", "taught_baseline", "taught_scale", "taught_cap")
            for name, default in ((n, next(f.default for f in fields(self) if f.name == n)) for n in taught):
                if (value := getattr(self, name)) != default:
                    raise ValueError(
                        f"{who}`{name}: {value}` acts on taught rows, and `peer_prompts` is 'all' (no taught rows): "
                        f"set peer_prompts 'better' or 'failed', or {name} {_shown(default)}"
                    )

    def over(self, config: Any) -> _LearnerView:
        """These settings over ``config``'s others: what :func:`~hacpo_trl.sharing.peer_rows.build_peer_rows` reads, so
        that its sharing options come from this checked object and the rest (rewards, lengths) from the config."""
        return _LearnerView(self, config)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], who: str = "") -> SharingSettings:
        """A learner's settings out of a config's values (``vars(config)``, with an agent's overrides applied) or a
        recipe's (``--plan``); a setting left out takes its default, and the loss has a peer band unless ``naive`` or
        ``peer_clipping: false`` says otherwise."""
        band = not values.get("naive") and values.get("peer_clipping") is not False
        chosen = {f.name: values.get(f.name, f.default) for f in fields(cls) if f.name in LEARNER_SETTINGS}
        return cls(**chosen, capability_metric=values.get("capability_metric"), band=band, who=who)


@dataclass(frozen=True)
class _LearnerView:
    """A learner's :class:`SharingSettings`, then its config for any other attribute (:meth:`SharingSettings.over`)."""

    sharing: SharingSettings
    config: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sharing if name in LEARNER_SETTINGS else self.config, name)


# The per-learner settings, in the order the model card lists them; those named where a report says what else
# limits what a learner takes from its peers.
LEARNER_SETTINGS = tuple(f.name for f in fields(SharingFields))
PEER_LIMITS = ("learn_from", "capability_gate", "peer_fade_steps", "peer_prompts")
