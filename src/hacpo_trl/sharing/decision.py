"""Whom a learner learns from, and on which prompts: the decision at each generation batch.

None of this is in the paper, which always learns from every peer. A learner's choice never changes what the other
agents receive: every agent shares its rollouts with all. :class:`SharingSettings` holds one learner's options,
checked once when it is made (:mod:`hacpo_trl.sharing.settings`, torch-free so that ``--plan`` reads it too;
re-exported here); :func:`decide` turns them, the capabilities and the batch's records into a :class:`PeerDecision`
(open peers, rescued prompts, the peers' weight), a pure function tested by hand. The trainer adds only what needs a
forward or a collective: the band gate's scoring of the peer rows (:meth:`PeerDecision.close_outside_band`).

A new per-learner option is one field of :class:`SharingFields` (name, type, default, help and doc, inherited by
`HACPOConfig` and taken by :class:`SharingSettings`), a check in ``SharingSettings.__post_init__`` and a rule in
:func:`decide`; a rule that keeps a peer on some prompts only sets :attr:`PeerDecision.prompts`, which
:func:`~hacpo_trl.sharing.peer_rows.build_peer_rows` already honours. The model card, the probe, the plan and the config's
list of settings that must agree across agents read the fields from :mod:`hacpo_trl.sharing.settings`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..algorithm import in_band
from .settings import (
    LEARNER_SETTINGS,
    PEER_FILTERS,
    PEER_LIMITS,
    PEER_NEGATIVES,
    PEER_PROMPTS,
    RUN_WIDE_SETTINGS,
    TAUGHT_BASELINES,
    TAUGHT_SCHEDULES,
    SharingFields,
    SharingSettings,
    parse_learn_from,
)

if TYPE_CHECKING:
    from ..run.exchange import RolloutBatch

__all__ = [
    "LEARNER_SETTINGS",
    "PEER_FILTERS",
    "PEER_NEGATIVES",
    "PEER_PROMPTS",
    "PEER_LIMITS",
    "TAUGHT_BASELINES",
    "TAUGHT_SCHEDULES",
    "RUN_WIDE_SETTINGS",
    "PeerDecision",
    "SharingFields",
    "SharingSettings",
    "decide",
    "gate_evidence",
    "open_peers",
    "parse_learn_from",
    "peer_fade_weight",
    "peers_in_band",
    "better_prompts",
    "rescued_prompts",
    "scored_rewards",
    "unsure_prompts",
]


def gate_evidence(peer: float, peer_rows: int, learner: float, learner_rows: int, gate: float = 1.0) -> float:
    """How many standard errors P̂_j lies above gate · P̂_k (not in the paper): the z of a one-sided test.

    z = (P̂_j − g·P̂_k) / sqrt(P̂_j(1 − P̂_j)/N_j + g²·P̂_k(1 − P̂_k)/N_k), each P̂ an accuracy over the N completions of
    its capability window. With 64 completions each, 0.28 against 0.11 gives z ≈ 2.5 and 0.12 against 0.08 z ≈ 0.8.
    No completions behind either P̂: no evidence (−inf). No variance (accuracies of 0 or 1): z = 0 at a zero gap,
    else ±inf.
    """
    for name, value in (("peer", peer), ("learner", learner)):
        if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= 1):
            raise ValueError(f"`{name}` accuracy must be in [0, 1], got {value!r}")
    for name, value in (("peer_rows", peer_rows), ("learner_rows", learner_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}")
    if not (isinstance(gate, int | float) and math.isfinite(gate) and gate >= 0):
        raise ValueError(f"`gate` must be a finite number >= 0, got {gate!r}")
    if peer_rows == 0 or learner_rows == 0:
        return -math.inf
    gap = peer - gate * learner
    se = math.sqrt(peer * (1 - peer) / peer_rows + gate**2 * learner * (1 - learner) / learner_rows)
    if se == 0:
        return 0.0 if gap == 0 else math.copysign(math.inf, gap)
    return gap / se


def open_peers(
    learner: str,
    agents: Sequence[str],
    capabilities: Mapping[str, float],
    learn_from: Sequence[str] | None = None,
    capability_gate: float = 0.0,
    gate_warmup: int = 0,
    batches_seen: int = 0,
    gate_confidence: float = 0.0,
    rows: Mapping[str, int] | None = None,
) -> list[str]:
    """The peers ``learner`` learns from at this generation batch, in ``agents`` order (not in the paper). The gate's
    settings come checked from :class:`SharingSettings`; the arguments of this batch are checked here.

    A peer is open when it is named in ``learn_from`` (``None``: every other agent; the learner itself is never a
    peer) and its capability is at least ``capability_gate`` times the learner's: P̂_j >= gate · P̂_k. The gate thus
    opens and closes by itself as capabilities cross during training; ``capability_gate=0`` keeps every named peer
    open, 1 opens only peers at least as capable as the learner. A learner with no open peer trains on its own rows
    alone, as GSPO does. The choice is the learner's only: every agent still shares its own rollouts with all.

    With a gate, ``gate_warmup`` > 0 keeps every peer closed while fewer than that many generation batches have been
    seen before this one (``batches_seen``): P̂ from one or two batches is too noisy to rank agents by (on the
    validation split one batch put a stronger agent at 0.08 against its weaker peer's 0.12, and the gate opened).

    With a gate, ``gate_confidence`` c > 0 asks the capability windows for evidence instead: peer j opens only when
    :func:`gate_evidence` is at least z_c, the standard normal quantile at c (1.645 at 0.95), with ``rows`` the
    completions behind each P̂ (accuracies, so that P̂(1 − P̂) is their variance). A clearly stronger peer opens at
    the first batch, two close ones stay closed until the windows tell them apart.
    """
    agents = list(agents)
    if learner not in agents:
        raise ValueError(f"unknown `learner` {learner!r}; agents are {agents}")
    names = agents if learn_from is None else list(learn_from)
    unknown = sorted({a for a in names if a not in agents})
    if unknown:
        raise ValueError(f"`learn_from` names unknown agent(s) {unknown}; agents are {agents}")
    if isinstance(batches_seen, bool) or not isinstance(batches_seen, int) or batches_seen < 0:
        raise ValueError(f"`batches_seen` must be an integer >= 0, got {batches_seen!r}")
    missing = [a for a in agents if a not in capabilities]
    if missing:
        raise ValueError(f"`capabilities` is missing agents {missing}")
    if capability_gate > 0 and batches_seen < gate_warmup:
        return []
    own = capabilities[learner]
    peers = [a for a in agents if a != learner and a in names and capabilities[a] >= capability_gate * own]
    if capability_gate == 0 or gate_confidence == 0:
        return peers
    if rows is None or any(a not in rows for a in agents):
        raise ValueError("`rows` (completions behind each P̂) is needed for every agent with `gate_confidence`")
    z = statistics.NormalDist().inv_cdf(gate_confidence)
    return [
        a for a in peers
        if gate_evidence(capabilities[a], rows[a], own, rows[learner], capability_gate) >= z
    ]  # fmt: skip


def peers_in_band(
    ratio: torch.Tensor,
    sources: Sequence[str],
    peers: Sequence[str],
    lower_bound: float,
    taught: Sequence[bool] = (),
    taught_floor: float = 0.0,
) -> dict[str, int]:
    """How many of each open peer's rows lie in the band at a batch's first update (not in the paper).

    ``ratio``: the learner's sequence ratio s (Eq. 11) of each peer row before any update; ``sources``: each row's
    generator. A peer with no row in the band gives no gradient (every row is clamped), yet its rewards still shift
    the learner's baseline; ``band_gate`` closes such a peer for the batch. A row flagged in ``taught`` has no band:
    it counts when s >= ``taught_floor`` (below it the row gets no gradient either).
    """
    if ratio.ndim != 1 or ratio.shape[0] != len(sources):
        raise ValueError(f"`ratio` must have one entry per source, got {tuple(ratio.shape)} for {len(sources)}")
    unknown = sorted({s for s in sources if s not in peers})
    if unknown:
        raise ValueError(f"rows from agent(s) {unknown} that are not open peers {list(peers)}")
    inside = in_band(ratio, lower_bound)
    if len(taught):
        flags = torch.tensor(list(taught), dtype=torch.bool, device=ratio.device)
        inside = torch.where(flags, ratio >= taught_floor, inside)
    inside = inside.tolist()
    return {p: sum(1 for s, ok in zip(sources, inside, strict=True) if ok and s == p) for p in peers}


def peer_fade_weight(step: int, fade_steps: int) -> float:
    """The weight of a learner's peer rows after ``step`` optimizer steps: 1 − step / fade_steps, floored at 0 (not
    in the paper; S2L-PO's progressive annealing back to the learner's own samples, here as a linear fade of the
    peer rows' advantages). ``fade_steps=0``: no fade (weight 1 throughout). At weight 0 the learner learns from no
    one (see :func:`open_peers`)."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"`step` must be an integer >= 0, got {step!r}")
    if not isinstance(fade_steps, int) or isinstance(fade_steps, bool) or fade_steps < 0:
        raise ValueError(f"`peer_fade_steps` must be an integer >= 0, got {fade_steps!r}")
    if fade_steps == 0:
        return 1.0
    return max(0.0, 1.0 - step / fade_steps)


def rescued_prompts(
    records: Sequence[RolloutBatch], learner: str, peers: Sequence[str], failed_rate: float = 0.0
) -> dict[str, set[str]]:
    """For each of ``peers``, the prompts of this generation batch that the learner failed at every scored completion
    (no positive reward, at least one finite) and that peer solved at least once (a positive reward), over all the
    agents' ranks (``records`` are every rank's): the same on every rank of the learner. A prompt the learner
    solved once is never rescued, so its own groups with any signal stay as GSPO sees them. ``failed_rate`` > 0
    (`taught_failed_rate`) also counts as failed a prompt whose success rate (positive rewards over scored
    completions) is at most that: 0.125 takes one success in 8."""
    own: dict[str, list[float]] = {}
    for r in records:
        if r.agent == learner:
            for pid, reward in zip(r.prompt_ids, r.rewards, strict=True):
                own.setdefault(pid, []).append(reward)
    failed = {
        pid for pid, rs in own.items()
        if sum(x > 0 for x in rs) <= failed_rate * sum(math.isfinite(x) for x in rs) and any(map(math.isfinite, rs))
    }  # fmt: skip
    out: dict[str, set[str]] = {peer: set() for peer in peers}
    for r in records:
        if r.agent in out:
            out[r.agent].update(pid for pid, reward in zip(r.prompt_ids, r.rewards, strict=True) if reward > 0)
    return {peer: solved & failed for peer, solved in out.items()}


def scored_rewards(records: Sequence[RolloutBatch], agent: str) -> dict[str, list[float]]:
    """``agent``'s finite rewards per prompt id, over every rank's ``records``: what a success rate is taken over."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.agent == agent:
            for pid, reward in zip(r.prompt_ids, r.rewards, strict=True):
                if math.isfinite(reward):
                    out.setdefault(pid, []).append(reward)
    return out


def unsure_prompts(
    records: Sequence[RolloutBatch], learner: str, peers: Sequence[str], failed_rate: float = 0.0
) -> dict[str, set[str]]:
    """For each of ``peers``, the prompts of this generation batch whose success rate for the learner (positive
    rewards over its scored completions, every rank's ``records``) is above ``failed_rate`` and below 1, and on which
    that peer wrote a wrong row (a finite reward, not positive): where `peer_negatives: unsure` takes its wrong rows
    as negatives. Disjoint from :func:`rescued_prompts`' at the same ``failed_rate``."""
    own = scored_rewards(records, learner)
    unsure = {pid for pid, rs in own.items() if failed_rate * len(rs) < sum(x > 0 for x in rs) < len(rs)}
    out: dict[str, set[str]] = {peer: set() for peer in peers}
    for r in records:
        if r.agent in out:
            out[r.agent].update(
                pid for pid, reward in zip(r.prompt_ids, r.rewards, strict=True)
                if pid in unsure and math.isfinite(reward) and not reward > 0
            )  # fmt: skip
    return out


def better_prompts(records: Sequence[RolloutBatch], learner: str, peers: Sequence[str]) -> dict[str, set[str]]:
    """For each of ``peers``, the prompts of this generation batch on which it did better than the learner: its
    success rate (share of its scored completions with a positive reward, over every rank's ``records``) above the
    learner's. Ties keep nothing (two groups that both failed, both solved, or solved alike teach nothing new), nor
    does a prompt one of the two has no scored completion of."""

    def rates(agent: str) -> dict[str, float]:
        return {pid: sum(x > 0 for x in rs) / len(rs) for pid, rs in scored_rewards(records, agent).items()}

    own = rates(learner)
    out = {}
    for peer in peers:
        theirs = rates(peer)
        out[peer] = {pid for pid, rate in theirs.items() if pid in own and rate > own[pid]}
    return out


@dataclass(frozen=True)
class PeerDecision:
    """Whom a learner learns from at one generation batch, and on which prompts.

    ``open`` peers enter every prompt's joint group (rows and rewards) unless ``prompts`` limits one of them to some
    prompts; ``rescued`` holds, for each peer the capability gate closed (within ``learn_from``), the prompts on
    which it still lends its rows (`capability_gate_rescue`; empty: none). ``weight`` scales the peer rows'
    advantages (`peer_fade_steps`). ``taught`` peers are limited to their taught prompts (`peer_prompts`) and give
    taught rows (:func:`~hacpo_trl.sharing.peer_loss.taught_weight`); ``batch_prompts`` counts the batch's prompts.
    ``taught_on_solo``: a batch of taught rows keeps the solo schedule (`taught_schedule: solo`). ``negatives``: for
    each taught peer, the prompts on which its wrong rows are negative taught rows (`peer_negatives: unsure`)."""

    open: tuple[str, ...] = ()
    rescued: Mapping[str, frozenset[str]] = field(default_factory=dict)
    weight: float = 1.0
    prompts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    taught: frozenset[str] = frozenset()
    batch_prompts: int = 0
    taught_on_solo: bool = False
    negatives: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def involved(self) -> tuple[str, ...]:
        """The peers whose rows and rewards enter some joint group: the open ones, then those rescuing a prompt."""
        return self.open + tuple(p for p, prompts in self.rescued.items() if prompts)

    @property
    def solo(self) -> bool:
        """No peer enters: the learner trains on its own rows as GSPO does."""
        return not self.involved

    @property
    def few_prompts(self) -> bool:
        """Peer rows of some prompts only (rescued ones, or taught ones with ``taught_on_solo``): the batch keeps
        the schedule of one learned from no one."""
        return bool(self.involved) and (not self.open or self.taught_on_solo)

    def only_prompts(self) -> dict[str, frozenset[str]]:
        """The peers limited to some prompts (:func:`~hacpo_trl.sharing.peer_rows.build_peer_rows`'s ``only_prompts``)."""
        limited = {
            p: self.prompts.get(p, frozenset()) | self.negatives.get(p, frozenset())
            for p in self.open if p in self.prompts or p in self.negatives
        }  # fmt: skip
        return {**limited, **{p: prompts for p, prompts in self.rescued.items() if prompts}}

    def rows_args(self) -> tuple[tuple[str, ...], dict[str, frozenset[str]], float, frozenset[str], dict]:
        """``(involved peers, only_prompts, weight, taught, negatives)``: the arguments of
        :func:`~hacpo_trl.sharing.peer_rows.build_peer_rows`."""
        negatives = {p: prompts for p, prompts in self.negatives.items() if p in self.open}
        return self.involved, self.only_prompts(), self.weight, self.taught, negatives

    def close_outside_band(self, in_band: Mapping[str, int]) -> PeerDecision:
        """`band_gate`: the decision without the involved peers none of whose rows has a gradient (``in_band``:
        per involved peer, over the learner's ranks, its rows in the band, or a taught peer's rows at or above
        `taught_ratio_floor`, :func:`peers_in_band`)."""
        keep = {p for p in self.involved if in_band.get(p, 0) > 0}
        return PeerDecision(
            tuple(p for p in self.open if p in keep),
            {p: (prompts if p in keep else frozenset()) for p, prompts in self.rescued.items()},
            self.weight,
            {p: prompts for p, prompts in self.prompts.items() if p in keep},
            self.taught & keep,
            self.batch_prompts,
            self.taught_on_solo,
            {p: prompts for p, prompts in self.negatives.items() if p in keep},
        )


def decide(
    settings: SharingSettings,
    learner: str,
    agents: Sequence[str],
    capabilities: Mapping[str, float],
    rows: Mapping[str, int],
    batches_seen: int,
    step: int,
    records: Sequence[RolloutBatch] = (),
    training: bool = True,
) -> PeerDecision:
    """The learner's :class:`PeerDecision` at a generation batch, before the band gate: peers named in
    ``learn_from`` and open by the capability gate (:func:`open_peers`, with ``rows`` the completions behind each
    P̂ and ``batches_seen`` the generation batches before this one), none once `peer_fade_steps` has faded them out
    after ``step`` optimizer steps (:func:`peer_fade_weight`); with `capability_gate_rescue`, in training, the
    prompts each closed peer rescues (:func:`rescued_prompts`, from every rank's ``records``); with `peer_prompts:
    better`, in training, each open peer only on the prompts it does better on (:func:`better_prompts`), with
    `peer_prompts: failed` only on those the learner failed entirely (or at most `taught_failed_rate` of the time)
    and it solved (:func:`rescued_prompts`), with `peer_negatives: unsure` also on those the learner is unsure on
    and it wrote a wrong row on (:func:`unsure_prompts`, its wrong rows there as negatives), and
    none on a batch without such a prompt (with `taught_schedule: solo` a batch of taught rows keeps the solo
    schedule). Outside training peers keep their full weight and nothing is rescued."""
    weight = peer_fade_weight(step, settings.peer_fade_steps) if training else 1.0
    allowed = parse_learn_from(settings.learn_from, list(agents))
    peers = open_peers(
        learner, agents, capabilities, allowed, settings.capability_gate, settings.capability_gate_warmup,
        batches_seen, settings.capability_gate_confidence, rows,
    )  # fmt: skip
    if weight == 0:
        return PeerDecision(weight=weight)
    rescued: dict[str, frozenset[str]] = {}
    if settings.capability_gate_rescue and training:
        closed = [a for a in agents if a != learner and a not in peers and (allowed is None or a in allowed)]
        rescued = {p: frozenset(prompts) for p, prompts in rescued_prompts(records, learner, closed).items()}
    if settings.peer_prompts != "all" and training:
        if settings.peer_prompts == "better":
            chosen = better_prompts(records, learner, peers)
        else:
            chosen = rescued_prompts(records, learner, peers, settings.taught_failed_rate)
        taught = {p: frozenset(prompts) for p, prompts in chosen.items() if prompts}
        negatives: dict[str, frozenset[str]] = {}
        if settings.peer_negatives == "unsure":
            wrong = unsure_prompts(records, learner, peers, settings.taught_failed_rate)
            negatives = {p: frozenset(prompts) for p, prompts in wrong.items() if prompts}
        teaching = tuple(p for p in peers if p in taught or p in negatives)
        count = len({pid for r in records for pid in r.prompt_ids})
        on_solo = settings.taught_schedule == "solo"
        return PeerDecision(teaching, rescued, weight, taught, frozenset(teaching), count, on_solo, negatives)
    return PeerDecision(tuple(peers), rescued, weight)
