"""Whom a learner learns from, and on which prompts: its sharing settings and the decision at each generation batch.

None of this is in the paper, which always learns from every peer. A learner's choice never changes what the other
agents receive: every agent shares its rollouts with all. :class:`SharingSettings` holds one learner's options,
checked once when it is made; :func:`decide` turns them, the capabilities and the batch's records into a
:class:`PeerDecision` (open peers, rescued prompts, the peers' weight), a pure function tested by hand. The trainer
adds only what needs a forward or a collective: the band gate's scoring of the peer rows
(:meth:`PeerDecision.close_outside_band`).

A new per-learner option is a field of :class:`SharingSettings` (checked in its ``__post_init__``) and a rule in
:func:`decide`; a rule that keeps a peer on some prompts only sets :attr:`PeerDecision.prompts`, which
:func:`~hacpo_trl.peer_rows.build_peer_rows` already honours. The model card, the probe and the config's list of
settings that must agree across agents read the fields from here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from .algorithm import in_band
from .presets import SHARING_PRESETS

_PAPER = SHARING_PRESETS["paper"]  # each setting's default: the paper's rule (`hacpo_trl.presets`)

if TYPE_CHECKING:
    from .exchange import RolloutBatch

__all__ = [
    "LEARNER_SETTINGS",
    "PEER_FILTERS",
    "PEER_PROMPTS",
    "PEER_LIMITS",
    "TAUGHT_BASELINES",
    "TAUGHT_SCHEDULES",
    "RUN_WIDE_SETTINGS",
    "PeerDecision",
    "SharingSettings",
    "decide",
    "gate_evidence",
    "open_peers",
    "parse_learn_from",
    "peer_fade_weight",
    "peers_in_band",
    "better_prompts",
    "rescued_prompts",
]

PEER_FILTERS = ("all", "correct", "positive")
PEER_PROMPTS = ("all", "better", "failed")
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


@dataclass(frozen=True)
class SharingSettings:
    """One learner's sharing options (the `HACPOConfig` fields of the same names, documented there), checked when
    made. Each may differ per agent. ``learn_from`` is checked against the run's agents by :func:`parse_learn_from`
    and ``solo_steps_per_generation`` against the schedule by :func:`hacpo_trl.schedule.solo_fits`, where those
    are known. The init-only ``capability_metric`` and ``band`` (whether the loss has a peer band) are the
    context some options need; ``who`` prefixes every error (e.g. ``"agent 'a': "``)."""

    peer_filter: str = _PAPER["peer_filter"]
    learn_from: str | list[str] | None = field(default="all", metadata={"limits_peers": True})
    capability_gate: float = field(default=_PAPER["capability_gate"], metadata={"limits_peers": True})
    capability_gate_warmup: int = 0
    capability_gate_confidence: float = _PAPER["capability_gate_confidence"]
    capability_gate_rescue: bool = False
    peer_fade_steps: int = field(default=0, metadata={"limits_peers": True})
    solo_steps_per_generation: int | None = None
    skip_empty_updates: bool = False
    band_gate: bool = _PAPER["band_gate"]
    peer_prompts: str = field(default=_PAPER["peer_prompts"], metadata={"limits_peers": True})
    taught_ratio_floor: float = _PAPER["taught_ratio_floor"]
    taught_schedule: str = _PAPER["taught_schedule"]
    taught_baseline: str = "joint"
    taught_scale: float = _PAPER["taught_scale"]
    taught_cap: float = _PAPER["taught_cap"]
    taught_failed_rate: float = _PAPER["taught_failed_rate"]
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
        """These settings over ``config``'s others: what :func:`~hacpo_trl.peer_rows.build_peer_rows` reads, so
        that its sharing options come from this checked object and the rest (rewards, lengths) from the config."""
        return _LearnerView(self, config)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], who: str = "") -> SharingSettings:
        """A learner's settings out of a config's values (``vars(config)``, with an agent's overrides applied); a
        setting left out takes its default."""
        band = bool(not values.get("naive") and values.get("peer_clipping"))
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
LEARNER_SETTINGS = tuple(f.name for f in fields(SharingSettings))
PEER_LIMITS = tuple(f.name for f in fields(SharingSettings) if f.metadata.get("limits_peers"))


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


def better_prompts(records: Sequence[RolloutBatch], learner: str, peers: Sequence[str]) -> dict[str, set[str]]:
    """For each of ``peers``, the prompts of this generation batch on which it did better than the learner: its
    success rate (share of its scored completions with a positive reward, over every rank's ``records``) above the
    learner's. Ties keep nothing (two groups that both failed, both solved, or solved alike teach nothing new), nor
    does a prompt one of the two has no scored completion of."""

    def rates(agent: str) -> dict[str, float]:
        scored: dict[str, list[float]] = {}
        for r in records:
            if r.agent == agent:
                for pid, reward in zip(r.prompt_ids, r.rewards, strict=True):
                    if math.isfinite(reward):
                        scored.setdefault(pid, []).append(reward)
        return {pid: sum(x > 0 for x in rs) / len(rs) for pid, rs in scored.items()}

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
    taught rows (:func:`~hacpo_trl.peer_loss.taught_weight`); ``batch_prompts`` counts the batch's prompts.
    ``taught_on_solo``: a batch of taught rows keeps the solo schedule (`taught_schedule: solo`)."""

    open: tuple[str, ...] = ()
    rescued: Mapping[str, frozenset[str]] = field(default_factory=dict)
    weight: float = 1.0
    prompts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    taught: frozenset[str] = frozenset()
    batch_prompts: int = 0
    taught_on_solo: bool = False

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
        """The peers limited to some prompts (:func:`~hacpo_trl.peer_rows.build_peer_rows`'s ``only_prompts``)."""
        limited = {p: prompts for p, prompts in self.prompts.items() if p in self.open}
        return {**limited, **{p: prompts for p, prompts in self.rescued.items() if prompts}}

    def rows_args(self) -> tuple[tuple[str, ...], dict[str, frozenset[str]], float, frozenset[str]]:
        """``(involved peers, only_prompts, weight, taught)``: the arguments of
        :func:`~hacpo_trl.peer_rows.build_peer_rows`."""
        return self.involved, self.only_prompts(), self.weight, self.taught

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
    and it solved (:func:`rescued_prompts`), and
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
        count = len({pid for r in records for pid in r.prompt_ids})
        on_solo = settings.taught_schedule == "solo"
        return PeerDecision(tuple(taught), rescued, weight, taught, frozenset(taught), count, on_solo)
    return PeerDecision(tuple(peers), rescued, weight)
