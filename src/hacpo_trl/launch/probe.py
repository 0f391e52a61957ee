"""`hacpo-probe`: before the GPU-days, whether the agents of a recipe can learn from each other.

    hacpo-probe --config recipes/tiny_size.yaml --output probe.json
    python -m hacpo_trl.probe --config recipes/tiny_size.yaml          # the same

It is launched like training, one process per agent process of the recipe (run bare, it starts that launch itself
with ``accelerate launch --multi_gpu``; under your own ``accelerate launch`` or ``torchrun`` it runs as is), and each
process builds its agent's real :class:`~hacpo_trl.trainer.HACPOTrainer` from the recipe, with no optimizer step. It
then runs the trainer's own first generation batch on the first ``--prompts`` training prompts: the agent generates
``num_generations`` completions per prompt with the recipe's backend and sampling settings (TRL's: HF ``generate``,
or vLLM where the recipe sets ``use_vllm``), the recipe's reward functions score them, every agent receives every
other agent's completions, and each learner re-tokenizes them into peer rows exactly as in training. Each peer row's
ratio s is then computed by the trainer's own scoring (``HACPOTrainer._row_logps`` and
:func:`~hacpo_trl.sharing.peer_loss.peer_log_ratios`), so the probe reports what the first update of a run would see.

Memory: each process holds one agent's model, as in training, but unsharded and without optimizer state (FSDP /
ZeRO-3 only apply once ``train()`` starts). Nothing is trained or saved.

Reported per ordered pair (learner <- generator): the peer ratio's median and quartiles; the shares below, in and
above the first band [1 - peer_delta, 1]; the same split for correct (reward > 0) and wrong completions; the share
of the rows that would train (valid and in band) that are wrong; and the capability coefficient ω the learner would
apply (from the sampled accuracies). Per agent: its accuracy on the sample and the share of its completions cut at
``max_completion_length``. Red flags are plain sentences with the number behind them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import torch

from ..sharing.decision import PEER_LIMITS, PeerDecision, peers_in_band
from ..sharing.presets import describe_sharing

__all__ = [
    "ProbeArguments",
    "build_trainer",
    "flags",
    "generation_backend",
    "main",
    "pair_stats",
    "probe_batch",
    "render",
    "run",
    "score_peer_rows_of_batch",
]

# An agent counts as cutting its completions when more than this share hit max_completion_length without stopping.
TRUNCATION_FLAG = 0.1
# Per-learner sharing settings a red flag names when the installed HACPOConfig has them.
SHARING_OPTIONS = PEER_LIMITS


@dataclass
class ProbeArguments:
    """What the probe samples and where it writes its report.

    Args:
        prompts: training prompts sampled (each answered ``num_generations`` times by every agent).
        output: write the report as JSON to this path.
    """

    prompts: int = field(default=32, metadata={"help": "Training prompts sampled by every agent."})
    output: str | None = field(default=None, metadata={"help": "Write the report as JSON to this path."})


# ------------------------------------------------------------------------------------------- the numbers


def _split(ratios: torch.Tensor, lower_bound: float) -> dict:
    n = int(ratios.numel())
    if n == 0:
        return {"rows": 0, "median": None, "below": None, "in_band": None, "above": None}
    below, above = ratios < lower_bound, ratios > 1.0
    return {
        "rows": n,
        "median": float(torch.quantile(ratios, 0.5)),
        "below": float(below.double().mean()),
        "in_band": float((~below & ~above).double().mean()),
        "above": float(above.double().mean()),
    }


def pair_stats(ratios, correct, valid, lower_bound: float, omega: float) -> dict:
    """One learner's view of one generator's completions: ratio quartiles, band shares (all, correct, wrong rows),
    and the share of the rows that would train (valid and in band) that are wrong answers."""
    ratios = torch.as_tensor(ratios, dtype=torch.float64).reshape(-1)
    correct = torch.as_tensor(correct, dtype=torch.bool).reshape(-1)
    valid = torch.as_tensor(valid, dtype=torch.bool).reshape(-1)
    out = {"rows": int(ratios.numel()), "omega": omega, "lower_bound": lower_bound}
    if ratios.numel():
        q = torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
        out["ratio"] = {"q1": q[0], "median": q[1], "q3": q[2]}
    else:
        out["ratio"] = {"q1": None, "median": None, "q3": None}
    out["all"] = _split(ratios, lower_bound)
    out["correct"] = _split(ratios[correct], lower_bound)
    out["wrong"] = _split(ratios[~correct], lower_bound)
    train = valid & (ratios >= lower_bound) & (ratios <= 1.0)
    out["would_train"] = int(train.sum())
    out["wrong_share_of_would_train"] = float((train & ~correct).sum() / train.sum()) if train.any() else None
    return out


def learner_view(decision: PeerDecision | None) -> dict:
    """What a learner takes from its peers at a batch, out of the trainer's own decision (before the band gate,
    :func:`hacpo_trl.sharing.decision.decide` with the batch's records): the peers that enter, and per peer the prompts it
    teaches (`peer_prompts`) or rescues (`capability_gate_rescue`), sorted."""
    if decision is None:  # no exchange: the learner learns from no one
        return {"learns_from": [], "taught": {}, "rescued": {}}
    return {
        "learns_from": list(decision.involved),
        "taught": {p: sorted(decision.prompts.get(p, ())) for p in decision.taught},
        "rescued": {p: sorted(prompts) for p, prompts in decision.rescued.items() if prompts},
    }


def band_gate_keeps(ratios, taught, lower_bound: float, floor: float, valid=None) -> bool:
    """Whether the band gate keeps a peer open at a batch: some of its valid rows (those with a loss; all if
    ``valid`` is None) count (in the band, or a taught row at or above the floor), by the trainer's own rule
    (:func:`hacpo_trl.sharing.peer_loss.band_counts`, which counts valid rows only)."""
    keep = [True] * len(ratios) if valid is None else [bool(v) for v in valid]
    ratios = torch.as_tensor([r for r, k in zip(ratios, keep, strict=True) if k], dtype=torch.float64)
    taught = [t for t, k in zip(taught, keep, strict=True) if k]
    sources = ["peer"] * int(ratios.numel())
    return peers_in_band(ratios, sources, ["peer"], lower_bound, taught, floor)["peer"] > 0


def taught_stats(rows: list[tuple], prompts: list[str], floor: float) -> dict:
    """A learner's taught rows from one peer (``rows``: (ratio, correct, valid, taught) each) and the prompts they
    come from: how many, their median ratio and how many are at or above `taught_ratio_floor`."""
    ratios = torch.tensor([r[0] for r in rows if r[3]], dtype=torch.float64)
    return {
        "prompts": prompts,
        "rows": int(ratios.numel()),
        "median": float(torch.quantile(ratios, 0.5)) if ratios.numel() else None,
        "at_floor": int((ratios >= floor).sum()),
        "floor": floor,
    }


def agent_stats(records, agent_names) -> dict:
    """Each agent's accuracy (reward > 0) on the sample, how many distinct rewards it got (a non-binary reward can
    have spread at accuracy 1), and the share of its completions that did not stop."""
    out = {}
    for agent in agent_names:
        rewards = [x for r in records if r.agent == agent for x in r.rewards]
        ended = [t for r in records if r.agent == agent for t in r.terminated]
        scored = [x for x in rewards if x == x]  # NaN: no reward function could score it
        out[agent] = {
            "completions": len(rewards),
            "accuracy": sum(x > 0 for x in scored) / len(scored) if scored else None,
            "distinct_rewards": len(set(scored)),
            "truncation_rate": sum(not t for t in ended) / len(ended) if ended else None,
        }
    return out


def flags(report: dict) -> list[str]:
    """The red flags of a report, each a plain sentence with the number behind it."""
    out = []
    max_len = report["max_completion_length"]
    lb = report["band"][0]
    for p in report["pairs"]:
        pair = f"{p['learner']} <- {p['generator']}"
        taught = p.get("peer_prompts", "all") != "all"  # taught rows have no band: the floor and the gate decide
        if taught and p.get("band_gate_keeps") is False and p["taught"]["rows"]:
            t = p["taught"]
            out.append(
                f"{pair}: none of its {t['rows']} taught rows reaches the floor {t['floor']:g} (median ratio "
                f"{t['median']:.3g}): the band gate closes {p['generator']} at such a batch, so {p['learner']} is not "
                f"taught by it; their formats, tokenizers or chat templates differ{_few(t['rows'])}."
            )
        elif not taught and p["rows"] and not p["all"]["in_band"]:
            median = p["ratio"]["median"]
            out.append(
                f"{pair}: no peer row in the band [{lb:.2f}, 1] (median ratio {median:.3g} over {p['rows']} rows): "
                f"{p['learner']} learns nothing from {p['generator']}, yet its rewards still shift "
                f"{p['learner']}'s baseline (`band_gate: true` closes such a peer); their tokenizers, chat templates "
                f"or stop tokens disagree, the traces are written differently, or the models are too far apart"
                f"{_few(p['rows'])}."
            )
        wrong = p["wrong_share_of_would_train"]
        if wrong is not None and wrong > 0.5:
            out.append(
                f"{pair}: {wrong:.0%} of the {p['would_train']} peer rows that would train are wrong answers, so "
                f"{p['learner']} would train mostly on wrong peer rows (each pushed down); `peer_filter: correct` "
                f"trains only on correct peer rows{_other_options(report)}."
            )
    for agent, a in report["agents"].items():
        if a["truncation_rate"] is not None and a["truncation_rate"] > TRUNCATION_FLAG:
            out.append(
                f"{agent}: {a['truncation_rate']:.0%} of its {a['completions']} completions were cut at "
                f"max_completion_length={max_len} without stopping; raise it, or those rows teach a cut-off answer."
            )
        if a["accuracy"] in (0.0, 1.0) and a.get("distinct_rewards", 1) <= 1:  # partial credit still has spread
            out.append(
                f"{agent}: own accuracy {a['accuracy']:.0%} on the sample of {a['completions']} completions: its "
                "groups have no reward spread, so it gets no learning signal from its own rows."
            )
    return out


FEW_ROWS = 16  # a verdict from fewer peer rows than this says it may be chance


def _few(rows: int) -> str:
    return f" (from {rows} rows only: too few to tell; sample more with --prompts)" if rows < FEW_ROWS else ""


def _other_options(report: dict) -> str:
    """The other settings that limit what a learner takes from its peers, where this version has them."""
    names = [f"`{n}`" for n in report.get("sharing_options", [])]
    return f" ({', '.join(names)} also limit what a learner takes from its peers)" if names else ""


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _shares(split: dict) -> str:
    if not split["rows"]:
        return "-"
    return f"{split['below']:.2f}/{split['in_band']:.2f}/{split['above']:.2f}"


def render(report: dict) -> str:
    """The console table of a report, then its red flags."""
    lb = report["band"][0]
    lines = [
        f"hacpo-probe: {report['prompts']} prompts x {report['num_generations']} completions per agent "
        f"({report['backend']}), first band [{lb:.3f}, 1]",
        *_sharing_lines(report.get("sharing", {})),
        "",
        "| learner <- generator | peer rows | ratio median [q1, q3] | below/in/above band | correct rows: "
        "below/in/above | wrong rows: below/in/above | would train | wrong share of those | ω |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["pairs"]:
        r = p["ratio"]
        ratio = "-" if r["median"] is None else f"{r['median']:.3g} [{r['q1']:.3g}, {r['q3']:.3g}]"
        closed = "" if p.get("learns_from", True) else f" ({_why_not(p)})"
        lines.append(
            f"| {p['learner']} <- {p['generator']}{closed} | {p['rows']} | {ratio} | {_shares(p['all'])} | "
            f"{p['correct']['rows']}: {_shares(p['correct'])} | {p['wrong']['rows']}: {_shares(p['wrong'])} | "
            f"{p['would_train']} | {_fmt(p['wrong_share_of_would_train'])} | {p['omega']:.2f} |"
        )
    taught = [p for p in report["pairs"] if p.get("peer_prompts", "all") != "all"]
    if taught:
        lines += ["", "Taught prompts (peer_prompts): the learner's prompts the peer teaches, and its taught rows:"]
    for p in taught:
        t = p["taught"]
        gate = (
            ""
            if p["band_gate_keeps"] is None
            else (
                "; band gate: keeps it open" if p["band_gate_keeps"] else "; band gate: closes it (no row at the floor)"
            )
        )
        median = "-" if t["median"] is None else f"{t['median']:.3g}"
        rate = p.get("taught_failed_rate") or 0
        which = f"{p['peer_prompts']}: solved at most {rate:g} of the time" if rate else p["peer_prompts"]
        lines.append(
            f"  {p['learner']} <- {p['generator']}: {len(t['prompts'])} of {report['prompts']} prompts "
            f"({which}), {t['rows']} taught rows, ratio median {median}, {t['at_floor']} at or above "
            f"the floor {t['floor']:g}{gate}{_few(t['rows']) if t['rows'] else ''}"
        )
    lines += ["", "| agent | completions | own accuracy | cut at max length |", "|---|---|---|---|"]
    for agent, a in report["agents"].items():
        lines.append(f"| {agent} | {a['completions']} | {_fmt(a['accuracy'])} | {_fmt(a['truncation_rate'])} |")
    found = report["flags"]
    lines += ["", "Red flags:" if found else "Red flags: none."]
    lines += [f"  - {f}" for f in found]
    return "\n".join(lines)


def _sharing_lines(sharing: dict[str, str]) -> list[str]:
    """Each learner's sharing mode; one line when they all share one."""
    if len(set(sharing.values())) == 1:
        return list(set(sharing.values()))
    return [f"{learner}: {text}" for learner, text in sharing.items()]


def _why_not(pair: dict) -> str:
    if pair.get("peer_prompts", "all") != "all":
        return f"does not learn from it: no prompt of the sample with peer_prompts {pair['peer_prompts']}"
    return "does not learn from it: learn_from / capability_gate"


def generation_backend(config) -> str:
    """How the trainer of ``config`` generates (TRL decides from the recipe; the probe generates through it)."""
    if getattr(config, "use_vllm", False):
        return f"vLLM, {getattr(config, 'vllm_mode', 'colocate')} mode"
    return "transformers generate"


# ------------------------------------------------------------------------------------ one process's part


def _probe_flags() -> set[str]:
    """The probe's own flags (`ProbeArguments`), which are no recipe keys."""
    return {f"--{f.name}" for f in dataclasses.fields(ProbeArguments)}


def _recipe_path(argv: list[str]) -> str:
    from .recipe import RecipeError, config_path

    path = config_path(argv)
    if path is None:
        raise RecipeError("hacpo-probe needs --config RECIPE")
    return path


def _my_prompts(dataset, count: int, agent_rank: int, agent_world: int) -> list[dict]:
    """This rank's share of the first ``count`` prompts, whole prompts per rank (the agent's ranks split them)."""
    count = min(count, len(dataset))
    per_rank = -(-count // agent_world)
    start = min(agent_rank * per_rank, count)
    return list(dataset.select(range(start, min(start + per_rank, count))))


@torch.no_grad()
def score_peer_rows_of_batch(trainer, batch: dict, n_self: int, n_peer: int) -> torch.Tensor:
    """The ratio s of every peer row of a generation batch, by the trainer's own scoring, in mini-batches of
    ``per_device_train_batch_size`` rows (a row whose generator recorded no tokens has no ratio: NaN)."""
    from ..sharing.peer_loss import peer_log_ratios

    ratios = torch.full((n_peer,), float("nan"), dtype=torch.float64)
    scorable = [i for i in range(n_peer) if int(batch["hacpo_old_len"][n_self + i]) > 0]
    size = trainer.args.per_device_train_batch_size
    for start in range(0, len(scorable), size):
        chunk = scorable[start : start + size]
        rows = torch.zeros(batch["completion_ids"].shape[0], dtype=torch.bool, device=batch["completion_ids"].device)
        rows[[n_self + i for i in chunk]] = True
        logps = trainer._row_logps(trainer.model, batch, rows)
        ratios[chunk] = peer_log_ratios(logps, batch, rows, trainer.hacpo_loss_config).exp().double().cpu()
    return ratios


def probe_batch(trainer, prompts: list[dict]) -> tuple[dict, list, object, torch.Tensor]:
    """The trainer's first generation batch on ``prompts`` (each ``num_generations`` times) and its peer rows'
    ratios: ``(batch, records, peer_rows, ratios)``. Every process of the launch must call it (an exchange)."""
    from ..sharing.decision import SharingSettings
    from ..sharing.peer_rows import PeerRows

    inputs = [row for row in prompts for _ in range(trainer.num_generations)]
    trainer.model.train()  # as in training: the generation batch is built in train mode
    trainer.last_peer_rows = None
    # every row of the decision before the band gate, whose verdict the report computes from their ratios
    settings, trainer.sharing = trainer.sharing, SharingSettings.from_values({**vars(trainer.args), "band_gate": False})
    try:
        batch = trainer._generate_and_score_completions(inputs)
    finally:
        trainer.sharing = settings
    rows = trainer.last_peer_rows or PeerRows()  # None: the learner learns from no peer (learn_from, gate)
    return batch, trainer.last_records, rows, score_peer_rows_of_batch(trainer, batch, len(inputs), len(rows))


def _my_rows(trainer, batch, rows, ratios) -> dict:
    """This process's peer rows per generator: (ratio, correct, valid) lists, for the report on global rank 0."""
    n_self = int((~batch["hacpo_is_peer"]).sum())
    out: dict[str, list] = {}
    for i, source in enumerate(rows.sources):
        if ratios[i] != ratios[i]:
            continue
        valid = bool(batch["hacpo_valid"][n_self + i])
        out.setdefault(source, []).append((float(ratios[i]), rows.rewards[i] > 0, valid, bool(rows.taught[i])))
    return out


def build_trainer(argv: list[str]):
    """This process's agent as training builds it, from the recipe in ``argv``: ``(trainer, probe arguments)``.
    The start-up is training's (:mod:`hacpo_trl.launch.start`); nothing is written where the recipe saves its agents
    (a scratch ``output_dir``, and no check of the recipe's), nothing is reported to trackers, and rollouts are
    shared whatever the recipe says."""
    from .start import build_trainer as build
    from .start import start

    _recipe_path(argv)
    port = os.environ.get("MASTER_PORT", "0")
    argv = [*argv, "--output_dir", os.path.join(tempfile.gettempdir(), f"hacpo-probe-{port}")]
    argv += ["--report_to", "none", "--share_rollouts", "true"]
    started = start(argv, tool_args=(ProbeArguments,), check_output=False, announce=False)
    trainer, _ = build(started.script_args, started.config, started.reward_funcs)
    return trainer, started.tool_args[0]


def run(trainer, probe_args: ProbeArguments) -> dict | None:
    """Probe with this process's ``trainer`` (every process of the launch calls it); global rank 0 prints the
    table, writes ``probe_args.output`` and returns the report (None elsewhere)."""
    config, global_rank = trainer.args, trainer.topology.global_rank
    acc = trainer.accelerator
    prompts = _my_prompts(trainer.train_dataset, probe_args.prompts, acc.process_index, acc.num_processes)
    batch, records, rows, ratios = probe_batch(trainer, prompts)
    low, high = config.capability_ratio_min, config.capability_ratio_max
    settings = trainer.sharing
    mine = {
        "learner": trainer.agent,
        **learner_view(trainer.last_decision),  # the trainer's decision on this batch, before the band gate
        "sharing": describe_sharing(vars(config)),
        "peer_prompts": settings.peer_prompts,
        "band_gate": settings.band_gate,
        "floor": settings.taught_ratio_floor,
        "failed_rate": settings.taught_failed_rate,
        "rows": _my_rows(trainer, batch, rows, ratios),
        "omega": {a: trainer.capability.omega(a, trainer.agent, low, high) for a in trainer.agent_names},
    }
    everyone = trainer.exchange.all_gather(mine, what="probe results")
    if global_rank != 0:
        return None
    report = _report(trainer, everyone, records, probe_args)
    print(render(report), flush=True)
    if probe_args.output:
        with open(probe_args.output, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nreport: {probe_args.output}", flush=True)
    return report


def _run(argv: list[str]) -> int:
    trainer, probe_args = build_trainer(argv)
    run(trainer, probe_args)
    trainer.topology.shutdown()
    return 0


def _report(trainer, everyone: list[dict], records, probe_args) -> dict:
    from ..algorithm import stepwise_lower_bound

    cfg = trainer.hacpo_loss_config
    lb = stepwise_lower_bound(0, cfg.delta, cfg.delta_step)
    names = trainer.agent_names
    pairs = []
    for learner in names:
        parts = [e for e in everyone if e["learner"] == learner]
        for generator in names:
            if generator == learner:
                continue
            rows = [r for e in parts for r in e["rows"].get(generator, [])]
            stats = pair_stats(
                [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], lb, parts[0]["omega"][generator]
            )
            mine = parts[0]
            learns = generator in mine["learns_from"]
            pair = {"learner": learner, "generator": generator, "learns_from": learns, **stats}
            pair["peer_prompts"] = mine["peer_prompts"]
            pair["taught_failed_rate"] = mine["failed_rate"]
            if mine["peer_prompts"] != "all":
                pair["taught"] = taught_stats(rows, mine["taught"].get(generator, []), mine["floor"])
            pair["rescued_prompts"] = mine["rescued"].get(generator, [])
            ratios, valid, taught = [r[0] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
            keeps = band_gate_keeps(ratios, taught, lb, mine["floor"], valid) if rows else False
            pair["band_gate_keeps"] = keeps if mine["band_gate"] and learns else None
            pairs.append(pair)
    report = {
        "prompts": min(probe_args.prompts, len(trainer.train_dataset)),
        "num_generations": trainer.num_generations,
        "max_completion_length": trainer.args.max_completion_length,
        "backend": generation_backend(trainer.args),
        "peer_filter": trainer.sharing.peer_filter,
        "sharing": {e["learner"]: e["sharing"] for e in everyone},
        "sharing_options": [n for n in SHARING_OPTIONS if hasattr(trainer.args, n)],
        "band": [lb, 1.0],
        "agents": agent_stats(records, names),
        "pairs": pairs,
    }
    report["flags"] = flags(report)
    return report


# ---------------------------------------------------------------------------------------------- launching


def _launch(argv: list[str]) -> int:
    """Run bare: start the launch training would use, one process per agent process of the recipe."""
    from ..run.placement import free_port, process_counts
    from .recipe import RecipeError, check_installed, check_recipe
    from .start import recipe_with_flags

    _, recipe = recipe_with_flags(_recipe_path(argv), argv, own=_probe_flags())
    check_installed(check_recipe(recipe))
    counts = process_counts(recipe) or [1]
    if len(counts) < 2:
        raise RecipeError("hacpo-probe needs a recipe with at least two agents: it measures what they share")
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(sum(counts)),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "hacpo_trl.probe", *argv,
    ]  # fmt: skip
    return subprocess.run(cmd).returncode


def _help() -> None:
    import argparse

    from trl import TrlParser

    from ..config import HACPOConfig
    from .recipe import HACPOScriptArguments

    parser = TrlParser(
        (ProbeArguments, HACPOScriptArguments, HACPOConfig),
        prog="hacpo-probe",
        description=__doc__.split("\n\n")[0] + " Recipe keys and flags are hacpo-train's.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.print_help()


def main(argv: list[str] | None = None) -> int:
    from .recipe import RecipeError
    from .start import StartupError

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        _help()
        return 0
    try:
        if "RANK" not in os.environ:
            return _launch(argv)
        return _run(argv)
    except (RecipeError, ValueError, StartupError) as exc:
        from .bootstrap import refuse  # one line per launch however the ranks race, as hacpo-train

        return refuse(exc, prog="hacpo-probe")


def cli() -> None:
    code = main()
    from ..run.topology import exit_process

    exit_process(code)


if __name__ == "__main__":
    cli()
