"""Hand-worked examples, properties and input validation for `hacpo_trl.algorithm`."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacpo_trl.algorithm import (
    CapabilityTracker,
    HACPOLossConfig,
    capability_aware_advantages,
    capability_ratio,
    hacpo_loss,
    joint_baseline,
    peer_objective,
    self_objective,
    sequence_log_ratio,
    stepwise_lower_bound,
)

# ---------------------------------------------------------------------------------------------- ω


def test_capability_ratio_hand_values():
    assert capability_ratio(0.6, 0.3) == pytest.approx(2.0)
    assert capability_ratio(0.01, 0.5) == pytest.approx(0.1)  # 0.02 clamped up
    assert capability_ratio(0.9, 0.05) == pytest.approx(10.0)  # 18 clamped down
    assert capability_ratio(0.9, 0.05, max_ratio=20.0) == pytest.approx(18.0)


@given(st.floats(1e-3, 1.0), st.floats(1e-3, 1.0))
def test_omega_reciprocal_inside_clamp(p_k, p_j):
    w_kj, w_jk = capability_ratio(p_k, p_j), capability_ratio(p_j, p_k)
    if 0.1 < p_k / p_j < 10:
        assert w_kj * w_jk == pytest.approx(1.0)
    assert 0.1 <= w_kj <= 10


# -------------------------------------------------------------------------------------- tracker


def test_tracker_hand_worked_window():
    t = CapabilityTracker(["a", "b"], window=3)
    assert t.capabilities() == {"a": 1.0, "b": 1.0}  # before any step
    # step 1: a solves 2/4, b solves 1/4
    t.update({"a": [1, 0, 0, 1], "b": [0, 0, 0, 1]})
    assert t.capabilities() == pytest.approx({"a": 0.5, "b": 0.25})
    # step 2: a 4/4, b 0/4 -> b's entry is floored at 1e-8
    t.update({"a": [1, 1, 1, 1], "b": [0, 0, 0, 0]})
    assert t.capability("a") == pytest.approx(0.75)
    assert t.capability("b") == pytest.approx((0.25 + 1e-8) / 2)
    # step 3 and 4: the window (3) drops step 1, then step 2
    t.update({"a": [0, 0, 0, 0], "b": [1, 1, 1, 1]})
    assert t.history("a") == pytest.approx([0.5, 1.0, 1e-8])
    t.update({"a": [1, 0, 0, 0], "b": [1, 1, 0, 0]})
    assert t.history("a") == pytest.approx([1.0, 1e-8, 0.25])
    assert t.capability("a") == pytest.approx((1.0 + 1e-8 + 0.25) / 3)
    assert t.capability("b") == pytest.approx((1e-8 + 1.0 + 0.5) / 3)
    assert t.steps == 4
    # ω(a, b) = P_a / P_b
    assert t.omega("a", "b") == pytest.approx(t.capability("a") / t.capability("b"))


def test_tracker_all_zero_window_never_divides_by_zero():
    t = CapabilityTracker(["a", "b"], window=2)
    for _ in range(3):
        t.update({"a": [0, 0], "b": [1, 0]})
    assert t.capability("a") == pytest.approx(1e-8)
    assert t.omega("b", "a") == 10.0 and t.omega("a", "b") == pytest.approx(0.1)


def test_tracker_mean_reward_metric():
    t = CapabilityTracker(["a"], metric="mean_reward")
    t.update({"a": [0.5, 0.25, -0.25, 1.0]})
    assert t.capability("a") == pytest.approx(0.375)
    t2 = CapabilityTracker(["a"])
    t2.update({"a": [0.5, 0.25, -0.25, 1.0]})  # accuracy: 3 of 4 are > 0
    assert t2.capability("a") == pytest.approx(0.75)


@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=12), st.integers(1, 5))
def test_tracker_window_is_mean_of_last_k(steps, window):
    t = CapabilityTracker(["a"], window=window)
    scores = []
    for rewards in steps:
        t.update({"a": rewards})
        scores.append(max(sum(rewards) / len(rewards), 1e-8))
    last = scores[-window:]
    assert t.history("a") == pytest.approx(last)
    assert t.capability("a") == pytest.approx(max(sum(last) / len(last), 1e-8))


def test_tracker_state_round_trip_continues_identically():
    a = CapabilityTracker(["x", "y"], window=2)
    a.update({"x": [1, 0], "y": [0, 0]})
    a.update({"x": [1, 1], "y": [1, 0]})
    b = CapabilityTracker(["x", "y"], window=2)
    b.load_state_dict(a.state_dict())
    assert b.capabilities() == a.capabilities() and b.steps == a.steps == 2
    a.update({"x": [0, 0], "y": [1, 1]})
    b.update({"x": [0, 0], "y": [1, 1]})
    assert b.state_dict() == a.state_dict()


def test_tracker_state_mismatch_is_rejected():
    state = CapabilityTracker(["x", "y"], window=2).state_dict()
    with pytest.raises(ValueError, match="agents"):
        CapabilityTracker(["x", "z"], window=2).load_state_dict(state)
    with pytest.raises(ValueError, match="window"):
        CapabilityTracker(["x", "y"], window=3).load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"agents": ["a"], "window": 0}, "window"),
        ({"agents": ["a", "a"]}, "unique"),
        ({"agents": []}, "agents"),
        ({"agents": ["a"], "metric": "f1"}, "metric"),
        ({"agents": ["a"], "floor": 0.0}, "floor"),
    ],
)
def test_tracker_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CapabilityTracker(**kwargs)


def test_tracker_bad_updates():
    t = CapabilityTracker(["a", "b"])
    with pytest.raises(ValueError, match="unknown agent 'c'"):
        t.update({"a": [1], "b": [1], "c": [1]})
    with pytest.raises(ValueError, match="missing agents \\['b'\\]"):
        t.update({"a": [1]})
    with pytest.raises(ValueError, match="rewards"):
        t.update({"a": [1.0, float("nan")], "b": [1]})
    assert t.steps == 0 and t.history("a") == []  # a rejected update changes nothing


# ------------------------------------------------------------------------------------ advantage

# Joint group of one prompt, n=2 agents x G=2: rows 0-1 generated by "a", rows 2-3 by "b".
SOURCES = ["a", "a", "b", "b"]
GROUP = [0, 0, 0, 0]


def test_advantage_hand_worked_weak_learner():
    # P_a = 0.3, P_b = 0.6, learner a: ω(a,b) = 0.5 scales b's rewards down.
    # rewards a = [1, 0], b = [1, 1]; μ̂_a = (1 + 0 + 0.5 + 0.5) / 4 = 0.5
    # σ = std([1, 0, 1, 1], unbiased) = sqrt(0.75 / 3) = 0.5;  A = (r - 0.5) / (0.5 + 1e-6)
    caps = {"a": 0.3, "b": 0.6}
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert float(joint_baseline(rewards, SOURCES, "a", caps)) == pytest.approx(0.5)
    adv = capability_aware_advantages(rewards, SOURCES, GROUP, "a", caps)
    expected = (torch.tensor([1.0, 0.0, 1.0, 1.0]) - 0.5) / (0.5 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_advantage_hand_worked_strong_learner():
    # Learner b: ω(b,a) = 2 scales a's rewards up. μ̂_b = (2*1 + 2*0 + 1 + 1) / 4 = 1.0 (not above 1: no guard)
    # A = (r - 1) / 0.5 = [0, -2, 0, 0]: b's own successes get no credit, a's failure is punished.
    caps = {"a": 0.3, "b": 0.6}
    adv = capability_aware_advantages([1.0, 0.0, 1.0, 1.0], SOURCES, GROUP, "b", caps)
    torch.testing.assert_close(adv, torch.tensor([0.0, -2.0, 0.0, 0.0], dtype=torch.float64) / (1 + 2e-6))


def test_advantage_baseline_guard():
    # P_a = 0.9, P_b = 0.3, learner a: ω(a,b) = 3; rewards a = [1, 1], b = [1, 0]
    # μ̂_a = (1 + 1 + 3 + 0) / 4 = 1.25 > 1 -> fall back to a's own mean, 1.0.  σ = std([1,1,1,0]) = 0.5
    caps = {"a": 0.9, "b": 0.3}
    rewards = [1.0, 1.0, 1.0, 0.0]
    guarded = capability_aware_advantages(rewards, SOURCES, GROUP, "a", caps)
    torch.testing.assert_close(guarded, torch.tensor([0.0, 0.0, 0.0, -2.0], dtype=torch.float64) / (1 + 2e-6))
    unguarded = capability_aware_advantages(rewards, SOURCES, GROUP, "a", caps, max_reward=None)
    torch.testing.assert_close(
        unguarded, torch.tensor([-0.25, -0.25, -0.25, -1.25], dtype=torch.float64) / (0.5 + 1e-6)
    )


def test_advantage_uniform_group_guard():
    caps = {"a": 0.3, "b": 0.6}
    rewards = [1.0, 1.0, 1.0, 1.0]
    assert capability_aware_advantages(rewards, SOURCES, GROUP, "b", caps).abs().sum() == 0
    # Without the guard, σ = 0 and ω-scaling invents a huge signal: μ̂_b = (2 + 2 + 1 + 1) / 4 = 1.5 -> (1-1.5)/1e-6
    raw = capability_aware_advantages(rewards, SOURCES, GROUP, "b", caps, zero_uniform_groups=False, max_reward=None)
    torch.testing.assert_close(raw, torch.full((4,), -0.5 / 1e-6, dtype=torch.float64))


def test_advantage_groups_are_independent():
    caps = {"a": 0.3, "b": 0.6}
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    sources = SOURCES + SOURCES
    adv = capability_aware_advantages(rewards, sources, [7] * 4 + [9] * 4, "a", caps)
    one = capability_aware_advantages(rewards[:4], SOURCES, GROUP, "a", caps)
    torch.testing.assert_close(adv[:4], one)
    assert adv[4:].abs().sum() == 0


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
    st.floats(0.01, 1.0),
    st.floats(0.01, 1.0),
)
def test_advantages_sum_to_zero_without_capability_baseline(ra, rb, pa, pb):
    rewards = torch.tensor(ra + rb, dtype=torch.float64)
    adv = capability_aware_advantages(
        rewards, ["a"] * 4 + ["b"] * 4, [0] * 8, "a", {"a": pa, "b": pb}, capability_weighting=False
    )
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-9)


def test_advantage_bad_input():
    caps = {"a": 0.3, "b": 0.6}
    with pytest.raises(ValueError, match="rewards"):
        capability_aware_advantages([1.0, float("inf"), 0, 0], SOURCES, GROUP, "a", caps)
    with pytest.raises(ValueError, match="sources"):
        capability_aware_advantages([1.0, 0.0, 1.0], SOURCES, [0, 0, 0], "a", caps)
    with pytest.raises(ValueError, match="group_ids"):
        capability_aware_advantages([1.0, 0.0, 1.0, 0.0], SOURCES, [0, 0], "a", caps)
    with pytest.raises(ValueError, match="unknown agents in `sources`: \\['c'\\]"):
        capability_aware_advantages([1.0, 0.0, 1.0, 0.0], ["a", "a", "c", "c"], GROUP, "a", caps)
    with pytest.raises(ValueError, match="unknown `learner` 'z'"):
        capability_aware_advantages([1.0, 0.0, 1.0, 0.0], SOURCES, GROUP, "z", caps)
    with pytest.raises(ValueError, match="rewards"):
        capability_aware_advantages(torch.ones(2, 2), SOURCES, GROUP, "a", caps)


# ------------------------------------------------------------------------------- ratio and loss


def test_stepwise_lower_bound_values():
    assert stepwise_lower_bound(0) == pytest.approx(0.8)
    assert stepwise_lower_bound(2) == pytest.approx(0.85)
    assert stepwise_lower_bound(3) == pytest.approx(0.875)
    assert stepwise_lower_bound(3, delta=0.2, delta_step=0.0) == pytest.approx(0.8)
    assert stepwise_lower_bound(100) == 1.0


@given(st.integers(0, 10_000), st.floats(0, 1), st.floats(0, 1))
def test_stepwise_lower_bound_never_exceeds_one(m, delta, step):
    lb = stepwise_lower_bound(m, delta, step)
    assert 1 - delta - 1e-12 <= lb <= 1.0


def test_sequence_log_ratio_mean_and_sum():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    old_mean = torch.tensor([-1.5, -0.25])
    old_len = torch.tensor([4, 2])
    # mean: -2 - (-1.5) = -0.5 ; -0.5 - (-0.25) = -0.25
    torch.testing.assert_close(sequence_log_ratio(logps, mask, old_mean), torch.tensor([-0.5, -0.25]))
    # sum: -6 - (-1.5 * 4) = 0 ; -0.5 - (-0.25 * 2) = 0
    torch.testing.assert_close(sequence_log_ratio(logps, mask, old_mean, old_len, mode="sum"), torch.tensor([0.0, 0.0]))
    # clamp to +-10
    far = sequence_log_ratio(logps, mask, torch.tensor([-50.0, 50.0]))
    torch.testing.assert_close(far, torch.tensor([10.0, -10.0]))


def _two_row_batch(peer_ratio=0.9):
    # Row 0 (self): tokens [-1.0, -1.2], mean -1.1, old mean -1.1 -> s = 1.
    # Row 1 (peer): one token -0.5, old mean chosen so that s = peer_ratio.
    logps = torch.tensor([[-1.0, -1.2], [-0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    old = torch.tensor([-1.1, -0.5 - math.log(peer_ratio)])
    adv = torch.tensor([2.0, 1.0])
    is_peer = torch.tensor([False, True])
    omega = torch.tensor([1.0, 0.5])
    return logps, mask, old, adv, is_peer, omega


def test_hacpo_loss_hand_worked():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    out = hacpo_loss(logps, mask, old, adv, is_peer, update_index=0, omega=omega)
    # self: min(1*2, clip(1)*2) = 2 ; peer: A*ω*c*sg(c)^1 = 1 * 0.5 * 0.9 * 0.9 = 0.405 ; loss = -(2 + 0.405) / 2
    assert out.loss.item() == pytest.approx(-1.2025, abs=1e-6)
    assert out.lower_bound == pytest.approx(0.8)
    out.loss.backward()
    # d loss / d logp: self tokens -(1/2) * A * s * (1/2) = -0.5 each; peer token -(1/2) * A * ω * sg(c) * s = -0.2025
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5, -0.5], [-0.2025, 0.0]]))


def test_hacpo_loss_stepwise_bound_drops_peer_row():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    # m = 5: lb = 0.8 + 5 * 0.025 = 0.925 > s = 0.9 -> the peer row is clamped: constant value, no gradient
    out = hacpo_loss(logps, mask, old, adv, is_peer, update_index=5, omega=omega)
    assert out.loss.item() == pytest.approx(-(2 + 0.5 * 0.925 * 0.925) / 2, abs=1e-6)
    assert out.peer_clipped_low.tolist() == [False, True]
    out.loss.backward()
    assert logps.grad[1].abs().sum() == 0 and logps.grad[0].abs().sum() > 0


def test_hacpo_loss_switches():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    # naive: the peer row is a GSPO row: min(0.9 * 1, clip(0.9, 1-3e-4, 1+4e-4) * 1) = 0.9, no ω
    naive = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, config=HACPOLossConfig(naive=True))
    assert float(naive.loss) == pytest.approx(-(2 + 0.9) / 2, abs=1e-6)
    # no capability coefficient: 1 * 0.9 * 0.9
    no_w = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, config=HACPOLossConfig(capability_coefficient=False))
    assert float(no_w.loss) == pytest.approx(-(2 + 0.81) / 2, abs=1e-6)
    # alpha = 3: 0.5 * 0.9 * 0.9^3
    a3 = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, config=HACPOLossConfig(alpha=3.0))
    assert float(a3.loss) == pytest.approx(-(2 + 0.5 * 0.9**4) / 2, abs=1e-6)


def test_hacpo_loss_no_peer_clipping_keeps_gradient_outside_band():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(1.2)
    out = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, config=HACPOLossConfig(peer_clipping=False))
    assert out.loss.item() == pytest.approx(-(2 + 0.5 * 1.2 * 1.2) / 2, abs=1e-6)
    out.loss.backward()
    assert logps.grad[1, 0] != 0


@settings(max_examples=80, deadline=None)
@given(st.floats(-1.0, 1.0), st.floats(-3.0, 3.0).filter(lambda a: abs(a) > 1e-3), st.integers(0, 8))
def test_peer_gradient_zero_exactly_outside_band(log_s, adv, m):
    lb = stepwise_lower_bound(m)
    s_value = math.exp(log_s)
    if abs(s_value - lb) < 1e-6 or abs(s_value - 1.0) < 1e-6:
        return  # on the boundary itself
    logp = torch.tensor([[log_s]], requires_grad=True)
    out = hacpo_loss(
        logp,
        torch.ones(1, 1),
        torch.zeros(1),
        torch.tensor([adv]),
        torch.tensor([True]),
        update_index=m,
        omega=torch.tensor([0.7]),
    )
    out.loss.backward()
    inside = lb <= s_value <= 1.0
    if inside:
        assert logp.grad.abs().item() > 0
        # d/dlogp of -A*ω*c*sg(c) = -A*ω*s*s
        assert logp.grad.item() == pytest.approx(-adv * 0.7 * s_value**2, rel=1e-5)
    else:
        assert logp.grad.item() == 0.0


@given(st.floats(0.5, 1.5), st.floats(-2, 2), st.floats(0, 1))
def test_alpha_zero_is_plain_clamped_ratio(s, adv, lb):
    ratio = torch.tensor([s])
    out = peer_objective(ratio, torch.tensor([adv]), 0.5, lb, alpha=0.0)
    torch.testing.assert_close(out, torch.tensor([adv * 0.5 * min(max(s, lb), 1.0)]))


def test_self_objective_is_pessimistic():
    s = torch.tensor([0.5, 1.5, 0.5, 1.5, 1.0001])
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    got = self_objective(s, a, 0.2, 0.2)
    torch.testing.assert_close(got, torch.tensor([0.5, 1.2, -0.8, -1.5, 1.0001]))


def test_kl_only_on_self_rows():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    ref = logps.detach() - 0.1  # every token: diff = -0.1 -> k3 = e^-0.1 + 0.1 - 1
    cfg = HACPOLossConfig(beta=0.5, kl_bias_correction=False)
    out = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, ref_logps=ref, config=cfg)
    k3 = math.exp(-0.1) + 0.1 - 1
    assert out.loss.item() == pytest.approx(-1.2025 + 0.5 * k3, abs=1e-6)  # mean over self rows only
    with pytest.raises(ValueError, match="ref_logps"):
        hacpo_loss(logps, mask, old, adv, is_peer, config=cfg)


def test_loss_bad_input():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    with pytest.raises(ValueError, match="advantages"):
        hacpo_loss(logps, mask, old, adv[:1], is_peer)
    with pytest.raises(ValueError, match="old_mean_logps"):
        hacpo_loss(logps, mask, torch.tensor([float("nan"), 0.0]), adv, is_peer)
    with pytest.raises(ValueError, match="logps"):
        hacpo_loss(logps.detach() + torch.tensor([[float("-inf"), 0.0], [0.0, 0.0]]), mask, old, adv, is_peer)
    with pytest.raises(ValueError, match="empty completions"):
        hacpo_loss(logps, torch.tensor([[1, 1], [0, 0]]), old, adv, is_peer)
    with pytest.raises(ValueError, match="mask"):
        hacpo_loss(logps, mask[:, :1], old, adv, is_peer)
    with pytest.raises(ValueError, match="is_peer"):
        hacpo_loss(logps, mask, old, adv, torch.tensor([True]))
    with pytest.raises(ValueError, match="omega"):
        hacpo_loss(logps, mask, old, adv, is_peer, omega=torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="update_index"):
        hacpo_loss(logps, mask, old, adv, is_peer, update_index=-1)
    with pytest.raises(ValueError, match="old_lengths"):
        hacpo_loss(logps, mask, old, adv, is_peer, config=HACPOLossConfig(ratio_mode="sum"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": -1.0}, "alpha"),
        ({"delta": 1.5}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"delta_step": -0.1}, "delta_step"),
        ({"epsilon_low": -1e-3}, "epsilon_low"),
        ({"beta": -1.0}, "beta"),
        ({"ratio_mode": "max"}, "ratio_mode"),
        ({"max_abs_log_ratio": 0.0}, "max_abs_log_ratio"),
    ],
)
def test_loss_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HACPOLossConfig(**kwargs)


def test_function_level_validation():
    with pytest.raises(ValueError, match="alpha"):
        peer_objective(torch.ones(1), torch.ones(1), 1.0, 0.8, alpha=-2)
    with pytest.raises(ValueError, match="delta"):
        stepwise_lower_bound(0, delta=2.0)
    with pytest.raises(ValueError, match="numerator"):
        capability_ratio(0.0, 0.5)
    with pytest.raises(ValueError, match="min_ratio"):
        capability_ratio(0.5, 0.5, min_ratio=2.0, max_ratio=1.0)


def test_module_is_pure_torch():
    import ast
    import inspect
    import subprocess
    import sys

    import hacpo_trl.algorithm as algorithm

    code = (
        "import sys, hacpo_trl.algorithm; print([m for m in ('trl', 'transformers', 'accelerate') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    tree = ast.parse(inspect.getsource(algorithm))
    used = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not [u for u in used | imported if "distributed" in u]


def test_invalid_rows_are_left_out_and_weights_scale():
    logps, mask, old, adv, is_peer, omega = _two_row_batch(0.9)
    # the peer row is invalid (and empty): the loss is the self row alone, -2 / 1
    empty = torch.tensor([[1, 1], [0, 0]])
    out = hacpo_loss(
        logps, empty, torch.tensor([-1.1, float("nan")]), adv, is_peer, omega=omega, valid=torch.tensor([True, False])
    )
    assert out.loss.item() == pytest.approx(-2.0, abs=1e-6)
    # an invalid peer row is neither kept nor clipped: it is not counted at all
    assert out.peer_clipped_low.tolist() == [False, False] and out.peer_clipped_high.tolist() == [False, False]
    out.loss.backward()
    assert logps.grad[1].abs().sum() == 0
    # weights multiply each row's objective: -(0.5 * 2 + 2 * 0.405) / 2
    w = hacpo_loss(logps, mask, old, adv, is_peer, omega=omega, weights=torch.tensor([0.5, 2.0]))
    assert w.loss.item() == pytest.approx(-(1.0 + 0.81) / 2, abs=1e-6)


def test_all_peer_rows_clipped_still_trains_self_rows():
    # s = 0.5 for both peer rows: below any band -> no peer gradient, but the self row still learns
    logps = torch.tensor([[-1.0], [-0.5], [-0.5]], requires_grad=True)
    old = torch.tensor([-1.0, -0.5 - math.log(0.5), -0.5 - math.log(0.5)])
    out = hacpo_loss(logps, torch.ones(3, 1), old, torch.tensor([1.0, 1.0, -1.0]), torch.tensor([False, True, True]))
    out.loss.backward()
    assert out.peer_clipped_low.tolist() == [False, True, True]
    assert logps.grad[0].abs().item() > 0 and logps.grad[1:].abs().sum() == 0
