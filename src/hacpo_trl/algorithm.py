"""The HACPO equations as pure torch functions.

Zhang, Huang et al., "Heterogeneous Agent Collaborative Reinforcement Learning" (arXiv 2603.02604).
Equation numbers follow the 2026-02-20 preprint; the official rewrite on verl (``zzx-peter/HACRL-code``,
``recipe/hacpo``) decides wherever the paper is ambiguous, and each such choice is said where it is made.

Notation: agent ``k`` is the *learner*, agent ``j`` the *source* (generator) of a completion. A *self*
row is a completion the learner generated; a *peer* row one it learns from another agent. P̂ is an
agent's capability (its recent accuracy) and ω(a, b) = clamp(P̂_a / P̂_b).

This module depends on torch only (no trl, no transformers, no torch.distributed), so that it can be
used with any trainer and tested by hand-worked examples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import torch

__all__ = [
    "CapabilityTracker",
    "HACPOLossConfig",
    "LossOutput",
    "capability_aware_advantages",
    "capability_ratio",
    "hacpo_loss",
    "in_band",
    "joint_baseline",
    "peer_objective",
    "peer_ratio_stats",
    "peer_row_order",
    "self_objective",
    "sequence_log_ratio",
    "stepwise_lower_bound",
]

CapabilityMetric = Literal["accuracy", "mean_reward"]


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------


def _check_finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"`{name}` contains non-finite values (NaN or inf)")


def _check_vector(name: str, value: torch.Tensor, length: int) -> None:
    if value.ndim != 1 or value.shape[0] != length:
        raise ValueError(f"`{name}` must have shape ({length},), got {tuple(value.shape)}")


def _check_probability(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise ValueError(f"`{name}` must be in [0, 1], got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}")


def _check_ratio_bounds(min_ratio: float, max_ratio: float) -> None:
    if not (0 < min_ratio <= max_ratio and math.isfinite(max_ratio)):
        raise ValueError(
            f"`min_ratio`/`max_ratio` must satisfy 0 < min_ratio <= max_ratio < inf, got {min_ratio!r}, {max_ratio!r}"
        )


# --------------------------------------------------------------------------------------------------
# capability: Eq. (8) and Eq. (9)
# --------------------------------------------------------------------------------------------------


def capability_ratio(numerator: float, denominator: float, min_ratio: float = 0.1, max_ratio: float = 10.0) -> float:
    """ω(a, b) = clamp(P̂_a / P̂_b, min_ratio, max_ratio) -- Eq. (8).

    The clamp to [0.1, 10] is not in the paper; both official implementations apply it, to the baseline and to
    the loss alike. Call ``capability_ratio(P_k, P_j)`` for the baseline weight ω(k, j) of a peer reward and
    ``capability_ratio(P_j, P_k)`` for the loss coefficient ω(j, k) of a peer row.
    """
    _check_ratio_bounds(min_ratio, max_ratio)
    for name, value in (("numerator", numerator), ("denominator", denominator)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"capability `{name}` must be a finite number > 0, got {value!r}")
    return min(max(numerator / denominator, min_ratio), max_ratio)


class CapabilityTracker:
    """Each agent's capability P̂: the mean of its per-step batch accuracy over the last K steps -- Eq. (9).

    Eq. (9) reads like a per-group mean; the official code (and the paper's text, "per-batch") uses the accuracy of
    all of an agent's completions in one training step, averaged over a window of the last K steps including the
    current one, with no EMA. Each entry and the average are floored at ``floor`` so that the ratios of Eq. (8)
    never divide by zero; before the first step every agent has P̂ = 1.

    Args:
        agents: the agent names, unique.
        window: K, the number of recent steps averaged (paper: 5).
        metric: ``"accuracy"`` (fraction of completions with reward > 0, the paper's) or ``"mean_reward"`` (for
            non-binary rewards).
        floor: lower bound of every entry and of P̂.
    """

    def __init__(
        self,
        agents: Sequence[str],
        window: int = 5,
        metric: CapabilityMetric = "accuracy",
        floor: float = 1e-8,
    ) -> None:
        agents = list(agents)
        if not agents or not all(isinstance(a, str) and a for a in agents):
            raise ValueError(f"`agents` must be a non-empty list of non-empty names, got {agents!r}")
        if len(set(agents)) != len(agents):
            raise ValueError(f"`agents` must be unique, got {agents!r}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"`window` must be an integer >= 1, got {window!r}")
        if metric not in ("accuracy", "mean_reward"):
            raise ValueError(f"`metric` must be 'accuracy' or 'mean_reward', got {metric!r}")
        if not (isinstance(floor, int | float) and math.isfinite(floor) and floor > 0):
            raise ValueError(f"`floor` must be a finite number > 0, got {floor!r}")
        self.agents = tuple(agents)
        self.window = window
        self.metric: CapabilityMetric = metric
        self.floor = float(floor)
        self.steps = 0
        self._history: dict[str, deque[float]] = {a: deque(maxlen=window) for a in self.agents}
        self._rows: dict[str, deque[int]] = {a: deque(maxlen=window) for a in self.agents}  # completions per entry

    def _check_agent(self, agent: str) -> None:
        if agent not in self._history:
            raise ValueError(f"unknown agent {agent!r}; known agents: {list(self.agents)}")

    def step_score(self, rewards: torch.Tensor | Sequence[float]) -> float:
        """One agent's score for one step: accuracy (reward > 0) or mean reward, floored."""
        rewards = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
        if rewards.numel() == 0:
            raise ValueError("`rewards` of an agent must not be empty")
        _check_finite("rewards", rewards)
        score = (rewards > 0).double().mean() if self.metric == "accuracy" else rewards.mean()
        return max(float(score), self.floor)

    def update(self, rewards_by_agent: Mapping[str, torch.Tensor | Sequence[float]]) -> dict[str, float]:
        """Record one training step: every agent's rewards for all its completions in that step.

        Every agent must be present, so that all windows advance together. Returns the new capabilities.
        """
        for agent in rewards_by_agent:
            self._check_agent(agent)
        missing = [a for a in self.agents if a not in rewards_by_agent]
        if missing:
            raise ValueError(f"`rewards_by_agent` is missing agents {missing}; every agent must report each step")
        # every agent's rewards are validated before any window changes
        scores = {a: self.step_score(rewards_by_agent[a]) for a in self.agents}
        for agent, score in scores.items():
            self._history[agent].append(score)
            self._rows[agent].append(int(torch.as_tensor(rewards_by_agent[agent]).numel()))
        self.steps += 1
        return self.capabilities()

    def capability(self, agent: str) -> float:
        """P̂ of one agent: the plain mean of its window, floored; 1.0 before any step."""
        self._check_agent(agent)
        history = self._history[agent]
        if not history:
            return 1.0
        return max(sum(history) / len(history), self.floor)

    def capabilities(self) -> dict[str, float]:
        return {a: self.capability(a) for a in self.agents}

    def rows(self) -> dict[str, int]:
        """How many completions each agent's P̂ averages (0 before any step): the sample size behind P̂."""
        return {a: sum(self._rows[a]) for a in self.agents}

    def omega(self, numerator: str, denominator: str, min_ratio: float = 0.1, max_ratio: float = 10.0) -> float:
        """ω(numerator, denominator) = clamp(P̂_numerator / P̂_denominator) -- Eq. (8)."""
        return capability_ratio(self.capability(numerator), self.capability(denominator), min_ratio, max_ratio)

    def history(self, agent: str) -> list[float]:
        self._check_agent(agent)
        return list(self._history[agent])

    def state_dict(self) -> dict:
        return {
            "agents": list(self.agents),
            "window": self.window,
            "metric": self.metric,
            "floor": self.floor,
            "steps": self.steps,
            "history": {a: list(h) for a, h in self._history.items()},
            "rows": {a: list(r) for a, r in self._rows.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a saved state. The agents, window and metric must match this tracker's."""
        for key in ("agents", "window", "metric", "floor", "steps", "history"):
            if key not in state:
                raise ValueError(f"capability tracker state is missing `{key}`")
        if list(state["agents"]) != list(self.agents):
            raise ValueError(f"capability tracker state is for agents {state['agents']}, not {list(self.agents)}")
        if state["window"] != self.window or state["metric"] != self.metric:
            raise ValueError(
                f"capability tracker state has window={state['window']}, metric={state['metric']!r}; "
                f"this tracker has window={self.window}, metric={self.metric!r}"
            )
        history = state["history"]
        if set(history) != set(self.agents) or any(len(history[a]) > self.window for a in self.agents):
            raise ValueError("capability tracker state has a malformed `history`")
        self.floor = float(state["floor"])
        self.steps = int(state["steps"])
        self._history = {a: deque((float(v) for v in history[a]), maxlen=self.window) for a in self.agents}
        # a state saved before rows were kept: 0 rows per entry, i.e. no evidence until the window refills
        rows = state.get("rows") or {a: [0] * len(history[a]) for a in self.agents}
        if set(rows) != set(self.agents) or any(len(rows[a]) != len(history[a]) for a in self.agents):
            raise ValueError("capability tracker state has a malformed `rows`")
        self._rows = {a: deque((int(v) for v in rows[a]), maxlen=self.window) for a in self.agents}

    def __repr__(self) -> str:
        caps = ", ".join(f"{a}={c:.4f}" for a, c in self.capabilities().items())
        return f"CapabilityTracker(window={self.window}, steps={self.steps}, {caps})"


def in_band(ratio: torch.Tensor, lower_bound: float) -> torch.Tensor:
    """Which peer rows lie in the band lb_m <= s <= 1 -- Eq. (14): the only peer rows with a gradient."""
    _check_probability("lower_bound", lower_bound)
    return (ratio >= lower_bound) & (ratio <= 1.0)


# --------------------------------------------------------------------------------------------------
# advantage: Eqs. (5)-(7)
# --------------------------------------------------------------------------------------------------


def _as_rewards(rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.tensor(rewards, dtype=torch.float64)
    elif not rewards.is_floating_point():
        rewards = rewards.double()
    if rewards.ndim != 1:
        raise ValueError(f"`rewards` must be one-dimensional, got shape {tuple(rewards.shape)}")
    _check_finite("rewards", rewards)
    return rewards


def _check_sources(sources: Sequence[str], length: int, capabilities: Mapping[str, float], learner: str) -> None:
    if len(sources) != length:
        raise ValueError(f"`sources` has {len(sources)} entries but `rewards` has {length}")
    if learner not in capabilities:
        raise ValueError(f"unknown `learner` {learner!r}; `capabilities` has {sorted(capabilities)}")
    unknown = sorted({s for s in sources if s not in capabilities})
    if unknown:
        raise ValueError(f"unknown agents in `sources`: {unknown}; `capabilities` has {sorted(capabilities)}")


def joint_baseline(
    rewards: torch.Tensor | Sequence[float],
    sources: Sequence[str],
    learner: str,
    capabilities: Mapping[str, float],
    *,
    capability_weighting: bool = True,
    min_ratio: float = 0.1,
    max_ratio: float = 10.0,
) -> torch.Tensor:
    """μ̂_k: the learner's baseline over one prompt's joint group of n·G rewards -- Eq. (7).

    Each peer reward is scaled by ω(k, source) = clamp(P̂_k / P̂_source) (self weight 1) and the mean is taken over
    all n·G rows. A strong learner thus scales weak peers' successes up (a harder baseline) and a weak learner
    scales strong peers' successes down. ``capability_weighting=False`` gives the plain joint mean (the paper's
    "w/o capability-aware advantage" ablation, and the Naive baseline).
    """
    rewards = _as_rewards(rewards)
    _check_sources(sources, rewards.shape[0], capabilities, learner)
    if rewards.numel() == 0:
        raise ValueError("`rewards` must not be empty")
    if not capability_weighting:
        return rewards.mean()
    weights = torch.tensor(
        [
            1.0 if s == learner else capability_ratio(capabilities[learner], capabilities[s], min_ratio, max_ratio)
            for s in sources
        ],
        dtype=rewards.dtype,
    )
    return (rewards * weights).mean()


def capability_aware_advantages(
    rewards: torch.Tensor | Sequence[float],
    sources: Sequence[str],
    group_ids: Sequence[Hashable],
    learner: str,
    capabilities: Mapping[str, float],
    *,
    capability_weighting: bool = True,
    zero_uniform_groups: bool = True,
    max_reward: float | None = 1.0,
    min_ratio: float = 0.1,
    max_ratio: float = 10.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A = (R − μ̂_k) / (σ_joint + eps) for every row, self and peer, of each prompt's joint group -- Eqs. (5)-(6).

    Rows are grouped by ``group_ids`` (one id per prompt); ``sources`` names the agent that generated each row.
    μ̂_k is :func:`joint_baseline`; σ_joint is the unbiased (Bessel) std of the group's *raw* rewards, not of the
    ω-scaled ones. Peer rows use the learner's baseline, not the peer's own (Eq. 50 and both codebases; Eq. 10's
    A^(j) is a typo).

    Guards from the official code, absent in the paper, each switchable:

    * ``zero_uniform_groups``: a group whose rewards are all equal gets advantage 0 (without it, ω-scaling would
      invent a signal: e.g. all-correct rows against a baseline below 1).
    * ``max_reward``: if μ̂_k exceeds it (1 for binary rewards; only possible when the learner is the stronger
      agent), fall back to the mean of the learner's own rewards in that group. ``None`` disables the guard.

    Returns a tensor shaped like ``rewards``.
    """
    rewards = _as_rewards(rewards)
    _check_sources(sources, rewards.shape[0], capabilities, learner)
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(f"`group_ids` has {len(group_ids)} entries but `rewards` has {rewards.shape[0]}")
    if not (isinstance(eps, int | float) and eps > 0):
        raise ValueError(f"`eps` must be > 0, got {eps!r}")
    if max_reward is not None and not math.isfinite(max_reward):
        raise ValueError(f"`max_reward` must be finite or None, got {max_reward!r}")

    groups: dict[Hashable, list[int]] = {}
    for index, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(index)

    advantages = torch.zeros_like(rewards)
    for gid, rows in groups.items():
        if len(rows) < 2:
            raise ValueError(f"group {gid!r} has a single row; a joint group needs at least 2 rewards for its std")
        group = rewards[rows]
        group_sources = [sources[i] for i in rows]
        if zero_uniform_groups and bool((group == group[0]).all()):
            continue  # advantage 0 for every row
        baseline = joint_baseline(
            group,
            group_sources,
            learner,
            capabilities,
            capability_weighting=capability_weighting,
            min_ratio=min_ratio,
            max_ratio=max_ratio,
        )
        if max_reward is not None and float(baseline) > max_reward:
            own = [i for i, s in enumerate(group_sources) if s == learner]
            if not own:
                raise ValueError(
                    f"group {gid!r}: the baseline exceeds `max_reward` and the learner {learner!r} has no own rows "
                    "to fall back on"
                )
            baseline = group[own].mean()
        advantages[rows] = (group - baseline) / (group.std(correction=1) + eps)
    return advantages


# --------------------------------------------------------------------------------------------------
# sequence ratio: Eq. (11)
# --------------------------------------------------------------------------------------------------


def sequence_log_ratio(
    logps: torch.Tensor,
    mask: torch.Tensor,
    old_mean_logps: torch.Tensor,
    old_lengths: torch.Tensor | None = None,
    *,
    mode: Literal["mean", "sum"] = "mean",
    max_abs_log_ratio: float = 10.0,
) -> torch.Tensor:
    """log s: the learner's sequence log-prob of y minus the generator's old one -- Eq. (11), GSPO-style.

    ``logps``/``mask`` (B, T) are the learner's per-token log-probs on *its own* tokenization of y (with grad);
    ``old_mean_logps`` (B,) is the generator's mean per-token log-prob under its pre-update policy on *its*
    tokenization, and ``old_lengths`` (B,) that tokenization's token count. Each side is averaged over its own
    length, so for a peer row s is a ratio of per-token geometric means (the official code's choice; Eq. 11
    writes a single |y|). ``mode="sum"`` compares whole-sequence log-likelihoods instead (an ablation the paper
    does not have; needs ``old_lengths``).

    The result is clamped to ±``max_abs_log_ratio`` (the official rewrite's ±10), which also stops the gradient
    of rows outside that band. Its gradient is mean_t ∇log π(y_t), the form TRL uses for
    ``importance_sampling_level="sequence"``.
    """
    if logps.ndim != 2 or mask.shape != logps.shape:
        raise ValueError(
            f"`logps` and `mask` must be (B, T) tensors of one shape, got {tuple(logps.shape)} and {tuple(mask.shape)}"
        )
    batch = logps.shape[0]
    _check_vector("old_mean_logps", old_mean_logps, batch)
    _check_finite("old_mean_logps", old_mean_logps)
    if mode not in ("mean", "sum"):
        raise ValueError(f"`mode` must be 'mean' or 'sum', got {mode!r}")
    if not (isinstance(max_abs_log_ratio, int | float) and max_abs_log_ratio > 0):
        raise ValueError(f"`max_abs_log_ratio` must be > 0, got {max_abs_log_ratio!r}")
    mask = mask.to(logps.dtype)
    lengths = mask.sum(-1)
    if bool((lengths <= 0).any()):
        empty = torch.nonzero(lengths <= 0).flatten().tolist()
        raise ValueError(f"`mask` has rows with no completion tokens (empty completions) at rows {empty}")
    _check_finite("logps", logps.detach()[mask.bool()])
    total = (logps * mask).sum(-1)
    old_mean_logps = old_mean_logps.to(logps.dtype)
    if mode == "mean":
        log_ratio = total / lengths - old_mean_logps
    else:
        if old_lengths is None:
            raise ValueError("`old_lengths` is required with mode='sum'")
        _check_vector("old_lengths", old_lengths, batch)
        if bool((old_lengths <= 0).any()):
            raise ValueError("`old_lengths` must be >= 1 for every row (empty completions)")
        log_ratio = total - old_mean_logps * old_lengths.to(logps.dtype)
    return log_ratio.clamp(-max_abs_log_ratio, max_abs_log_ratio)


# --------------------------------------------------------------------------------------------------
# objectives: Eq. (10) self term, Eqs. (12)-(14) peer term
# --------------------------------------------------------------------------------------------------


def self_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float = 3e-4, epsilon_high: float = 4e-4
) -> torch.Tensor:
    """GSPO's clipped objective min(s·A, clip(s, 1−ε_low, 1+ε_high)·A) for self rows -- Eq. (10), first term.

    Paper defaults ε = (3e-4, 4e-4). (Eq. 47 writes clip(s^(1,2)); it means the self ratio s^(1,1).)
    """
    _check_non_negative("epsilon_low", epsilon_low)
    _check_non_negative("epsilon_high", epsilon_high)
    clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    return torch.minimum(ratio * advantages, clipped * advantages)


def stepwise_lower_bound(update_index: int, delta: float = 0.2, delta_step: float = 0.025) -> float:
    """lb_m = min(1, 1 − δ + m·δ_step): the peer-ratio lower bound after m updates on this batch -- Eq. (14).

    m counts optimizer updates already made on the current generation batch, so later mini-batches (which hold
    the peer rows, ordered after self rows) see a tighter band. ``delta_step=0`` gives a fixed bound (the
    "w/o stepwise" ablation). Note the paper's Table 5 column "δ" is really the bound 1 − δ.
    """
    if not isinstance(update_index, int) or isinstance(update_index, bool) or update_index < 0:
        raise ValueError(f"`update_index` must be an integer >= 0, got {update_index!r}")
    _check_probability("delta", delta)
    _check_non_negative("delta_step", delta_step)
    return min(1.0, 1.0 - delta + update_index * delta_step)


def peer_objective(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    omega: torch.Tensor | float,
    lower_bound: float,
    alpha: float = 1.0,
) -> torch.Tensor:
    """A · ω(j,k) · c · sg(c)^α with c = clamp(s, lb_m, 1) for peer rows -- Eqs. (10), (12), (13).

    ``omega`` is ω(j, k) = clamp(P̂_source / P̂_learner), opposite to the baseline's ω(k, j) (Eqs. 10, 50 and both
    codebases, not Remark 3.1(ii)'s text). The clamp is *hard*, as in the official code: a row outside [lb_m, 1],
    s > 1 included, gives no gradient. sg(c)^α (Eq. 12) down-weights unlikely rows; α = 0 turns it off.
    """
    _check_non_negative("alpha", alpha)
    _check_probability("lower_bound", lower_bound)
    clamped = ratio.clamp(lower_bound, 1.0)
    return advantages * omega * clamped * clamped.detach().pow(alpha)


@dataclass(frozen=True)
class HACPOLossConfig:
    """The loss hyperparameters and the switches that turn the paper's baselines and ablations into configs.

    Args:
        epsilon_low, epsilon_high: GSPO clip range of self rows (paper: 3e-4, 4e-4).
        delta: the peer band's initial width; lower bound 1 − δ (paper: 0.2, i.e. bound 0.8).
        delta_step: how much the lower bound tightens per optimizer update (paper: 0.025; 0 = fixed bound).
        alpha: exponent of the stop-gradient reweighting sg(c)^α (paper: 1; 0 = off).
        capability_coefficient: multiply peer objectives by ω(j, k); ``False`` uses 1 (the "w/o ω in the loss"
            ablation).
        peer_clipping: clamp peer ratios to [lb_m, 1]; ``False`` uses the raw ratio (the "w/o clipping"
            ablation of Fig. 4).
        naive: treat peer rows exactly like self rows (GSPO clip, no ω, no α, no band): the paper's "Naive"
            baseline. Overrides the three switches above for peer rows.
        ratio_mode: ``"mean"`` (per-token geometric means, official) or ``"sum"`` (whole-sequence likelihoods).
        max_abs_log_ratio: clamp of log s before exp (official: 10).
        beta: coefficient of the low-variance (k3) KL to a reference policy, on self rows only (official code:
            1e-3; paper: not mentioned; default 0).
        kl_bias_correction: multiply the KL per token by the self ratio, as TRL does with
            ``use_bias_correction_kl=True``.
    """

    epsilon_low: float = 3e-4
    epsilon_high: float = 4e-4
    delta: float = 0.2
    delta_step: float = 0.025
    alpha: float = 1.0
    capability_coefficient: bool = True
    peer_clipping: bool = True
    naive: bool = False
    ratio_mode: Literal["mean", "sum"] = "mean"
    max_abs_log_ratio: float = 10.0
    beta: float = 0.0
    kl_bias_correction: bool = True

    def __post_init__(self) -> None:
        _check_non_negative("epsilon_low", self.epsilon_low)
        _check_non_negative("epsilon_high", self.epsilon_high)
        _check_probability("delta", self.delta)
        _check_non_negative("delta_step", self.delta_step)
        _check_non_negative("alpha", self.alpha)
        _check_non_negative("beta", self.beta)
        if self.ratio_mode not in ("mean", "sum"):
            raise ValueError(f"`ratio_mode` must be 'mean' or 'sum', got {self.ratio_mode!r}")
        if not (isinstance(self.max_abs_log_ratio, int | float) and self.max_abs_log_ratio > 0):
            raise ValueError(f"`max_abs_log_ratio` must be > 0, got {self.max_abs_log_ratio!r}")
        if self.epsilon_low >= 1:
            raise ValueError(f"`epsilon_low` must be < 1, got {self.epsilon_low!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LossOutput:
    """The loss (to minimise) and detached per-row diagnostics for metrics."""

    loss: torch.Tensor
    ratio: torch.Tensor  # s per row
    objective: torch.Tensor  # per-row objective (before the KL term)
    lower_bound: float  # lb_m used for peer rows
    peer_clipped_low: torch.Tensor  # bool per row: peer row with s < lb_m (no gradient)
    peer_clipped_high: torch.Tensor  # bool per row: peer row with s > 1 (no gradient)
    self_clipped: torch.Tensor  # bool per row: self row whose ratio left [1-ε_low, 1+ε_high]
    kl: torch.Tensor | None  # token-mean KL of each valid self row, if beta > 0


def hacpo_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    old_mean_logps: torch.Tensor,
    advantages: torch.Tensor,
    is_peer: torch.Tensor,
    *,
    update_index: int = 0,
    omega: torch.Tensor | None = None,
    old_lengths: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    outside_rows: int = 0,
    outside_objective: float = 0.0,
    config: HACPOLossConfig | None = None,
) -> LossOutput:
    """The HACPO loss of one mini-batch of learner k: −mean over rows of the per-row objective -- Eq. (10)/(50).

    Args:
        logps, mask: (B, T) learner log-probs (with grad) and completion mask, on the learner's tokenization.
        old_mean_logps: (B,) generator's mean per-token log-prob before the update (own tokenization).
        advantages: (B,) from :func:`capability_aware_advantages`.
        is_peer: (B,) bool, True for rows another agent generated.
        update_index: m, optimizer updates already made on this generation batch (Eq. 14).
        omega: (B,) ω(j, k) = clamp(P̂_source / P̂_learner) per row (ignored on self rows); default 1.
        old_lengths: (B,) generator token counts; needed for ``ratio_mode="sum"``.
        ref_logps: (B, T) reference log-probs, needed when ``config.beta > 0``.
        valid: (B,) bool; rows marked False (padding rows, unscorable rows) contribute nothing and are left out of
            the mean. They may have empty masks. Default: every row counts.
        weights: (B,) non-negative per-row factor on the objective (e.g. a vLLM importance-sampling correction).
        outside_rows, outside_objective: rows of the same mini-batch left out of this call because their objective is
            a constant (peer rows already known to be outside the band: no gradient), and the sum of their
            objectives; the mean then runs over ``valid rows + outside_rows`` exactly as if they were here.

    Aggregation is per sequence then mean over (valid) sequences (the official ``seq-mean-token-mean``). The
    optional KL is the token mean per self row, averaged over self rows, times β. With no peer rows and ``beta=0``
    the loss and its gradient equal TRL's ``GRPOTrainer`` with ``importance_sampling_level="sequence"``,
    ``loss_type="grpo"`` (before TRL's division by gradient-accumulation steps, which is the caller's to do).
    """
    config = config or HACPOLossConfig()
    if logps.ndim != 2:
        raise ValueError(f"`logps` must be (B, T), got shape {tuple(logps.shape)}")
    batch = logps.shape[0]
    _check_vector("advantages", advantages, batch)
    _check_finite("advantages", advantages)
    _check_vector("is_peer", is_peer, batch)
    is_peer = is_peer.to(device=logps.device, dtype=torch.bool)
    if omega is None:
        omega = torch.ones(batch, dtype=logps.dtype, device=logps.device)
    _check_vector("omega", omega, batch)
    _check_finite("omega", omega)
    if bool((omega <= 0).any()):
        raise ValueError("`omega` must be > 0 for every row")

    if valid is None:
        valid = torch.ones(batch, dtype=torch.bool, device=logps.device)
    _check_vector("valid", valid, batch)
    valid = valid.to(device=logps.device, dtype=torch.bool)
    ratio_mask = mask
    if not bool(valid.all()):
        # invalid rows may be empty; give them one (ignored) token so the ratio is defined
        ratio_mask = mask.clone()
        ratio_mask[~valid, 0] = 1
    log_ratio = sequence_log_ratio(
        logps,
        ratio_mask,
        old_mean_logps.masked_fill(~valid.to(old_mean_logps.device), 0.0),
        None if old_lengths is None else old_lengths.masked_fill(~valid.to(old_lengths.device), 1),
        mode=config.ratio_mode,
        max_abs_log_ratio=config.max_abs_log_ratio,
    )
    ratio = log_ratio.exp()
    advantages = advantages.to(logps.dtype)
    omega = omega.to(logps.dtype)

    lower_bound = stepwise_lower_bound(update_index, config.delta, config.delta_step)
    gspo = self_objective(ratio, advantages, config.epsilon_low, config.epsilon_high)
    if config.naive:
        peer = gspo
    else:
        coefficient = omega if config.capability_coefficient else torch.ones_like(omega)
        if config.peer_clipping:
            peer = peer_objective(ratio, advantages, coefficient, lower_bound, config.alpha)
        else:
            peer = advantages * coefficient * ratio * ratio.detach().pow(config.alpha)
    objective = torch.where(is_peer, peer, gspo)
    if weights is not None:
        _check_vector("weights", weights, batch)
        _check_finite("weights", weights)
        objective = objective * weights.to(objective.dtype)
    objective = objective.masked_fill(~valid, 0.0)
    if outside_rows < 0:
        raise ValueError(f"`outside_rows` must be >= 0, got {outside_rows}")
    loss = -(objective.sum() + outside_objective) / (valid.sum() + outside_rows).clamp(min=1)

    kl = None
    own = ~is_peer & valid
    if config.beta > 0:
        if ref_logps is None or ref_logps.shape != logps.shape:
            raise ValueError("`ref_logps` of the same shape as `logps` is required when `beta` > 0")
        if bool(own.any()):
            # only on self rows: a peer's completion says nothing about drift from the learner's reference
            token_mask = mask[own].to(logps.dtype)
            diff = ref_logps[own].to(logps.dtype) - logps[own]
            per_token_kl = torch.exp(diff) - diff - 1  # k3, "low_var_kl"
            if config.kl_bias_correction:
                per_token_kl = per_token_kl * ratio[own].unsqueeze(-1)
            kl = (per_token_kl * token_mask).sum(-1) / token_mask.sum(-1).clamp(min=1)
            loss = loss + config.beta * kl.mean()

    r = ratio.detach()
    banded = (is_peer & valid) if (config.peer_clipping and not config.naive) else torch.zeros_like(is_peer)
    clipped_low = banded & (r < lower_bound)
    clipped_high = banded & (r > 1.0)
    self_clipped = own & ((r < 1 - config.epsilon_low) | (r > 1 + config.epsilon_high))
    return LossOutput(
        loss=loss,
        ratio=r,
        objective=objective.detach(),
        lower_bound=lower_bound,
        peer_clipped_low=clipped_low,
        peer_clipped_high=clipped_high,
        self_clipped=self_clipped,
        kl=None if kl is None else kl.detach(),
    )


# --------------------------------------------------------------------------------------------------
# row layout over the updates of a generation batch (which lb_m each peer row sees), and peer-ratio statistics
# --------------------------------------------------------------------------------------------------

PEER_LAYOUTS = ("self_first", "interleaved")


def peer_row_order(
    n_self: int, n_total: int, num_chunks: int, layout: str = "self_first", generator: torch.Generator | None = None
) -> torch.Tensor:
    """The order of a learner's rows (self rows ``0..n_self-1``, then peer rows) before the generation batch is cut
    into ``num_chunks`` equal contiguous chunks, one per update (micro-)batch, in turn.

    * ``"self_first"``: shuffled self rows, then shuffled peer rows. Peer rows land in the last updates and see the
      tightest bounds lb_m (Eq. 14). This is the paper's text ("self first"), v1's intent, and v1 / v0 on one GPU.
    * ``"interleaved"``: the same self-first sequence dealt round-robin into the chunks (chunk m takes positions
      m, m + num_chunks, ...), so every update holds an equal share of self and of peer rows and peer rows see all
      bounds. This is what v1 does as launched on 8 GPUs: it cuts the self-first batch into contiguous per-GPU
      chunks, so every optimizer step takes half its rows from self-only ranks and half from peer-only ranks.
    """
    if layout not in PEER_LAYOUTS:
        raise ValueError(f"`peer_layout` must be one of {PEER_LAYOUTS}, got {layout!r}")
    if not 0 <= n_self <= n_total or num_chunks < 1:
        raise ValueError(f"need 0 <= n_self <= n_total and num_chunks >= 1, got {n_self}, {n_total}, {num_chunks}")
    order = torch.cat(
        [torch.randperm(n_self, generator=generator), n_self + torch.randperm(n_total - n_self, generator=generator)]
    )
    if layout == "self_first":
        return order
    if n_total % num_chunks:
        raise ValueError(f"{n_total} rows cannot be dealt into {num_chunks} equal chunks")
    return deal_round_robin(order, num_chunks)


def deal_round_robin(order: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """``order`` rearranged so that its ``num_chunks`` contiguous chunks are ``order[m::num_chunks]``, m = 0, 1, ..."""
    return torch.cat([order[m::num_chunks] for m in range(num_chunks)])


def peer_ratio_stats(ratios: torch.Tensor, lower_bounds: torch.Tensor) -> dict[str, float]:
    """Summary of peer sequence ratios s and the bound lb_m each was clamped with, comparable with the paper.

    The paper's Table 6 reports per-step means of s_hete (~0.90); s is heavy-tailed (clamped at e^±10), so the
    arithmetic mean alone misleads: the median and the geometric mean exp(mean log s) are given beside it.
    ``in_band`` is the share with lb_m <= s <= 1 (the rows that get a gradient), ``low`` / ``high`` the shares
    below lb_m and above 1, ``lower_bound`` the mean lb_m applied. Empty input gives an empty dict.
    """
    ratios = ratios.detach().double().flatten()
    lower_bounds = lower_bounds.detach().double().flatten()
    if ratios.shape != lower_bounds.shape:
        raise ValueError(
            f"`ratios` and `lower_bounds` must have the same length, got {ratios.shape} / {lower_bounds.shape}"
        )
    if ratios.numel() == 0:
        return {}
    if bool((ratios <= 0).any()) or not bool(torch.isfinite(ratios).all()):
        raise ValueError("peer ratios must be finite and > 0")
    low = ratios < lower_bounds
    high = ratios > 1.0
    return {
        "mean": float(ratios.mean()),
        "median": float(ratios.median()),  # the lower of the two middle values for an even count (torch's rule)
        "geomean": float(ratios.log().mean().exp()),
        "in_band": float((~low & ~high).double().mean()),
        "low": float(low.double().mean()),
        "high": float(high.double().mean()),
        "lower_bound": float(lower_bounds.mean()),
    }
