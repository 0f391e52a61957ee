"""What padding costs a step with long-tailed completion lengths, and what trimming it saves (`trim_padding`).

    python benchmarks/studies/padding/padding.py            # 6 interleaved repetitions of each setting (about 8 min on 2 loaded cores)
    python benchmarks/studies/padding/padding.py --quick    # 2 repetitions (a smoke check, not for RESULTS.md)

One generation batch of one rank of a HACPO learner is built in TRL's layout (prompts left-padded, completions
right-padded) and put through the trainer's own forwards, as a step runs them, with `trim_padding` off (TRL's padded
forwards, today's behaviour before this option), on, and on with `group_by_length`:

* ``old_logps``: `HACPOTrainer._own_old_logps` over the rank's own rows, chunks of `per_device_train_batch_size`;
* ``ref_logps``: the reference pass over the own rows, through the same hook as TRL's (`beta > 0`);
* then per micro-batch (own rows first, then peer rows: `peer_layout="self_first"`), ``peer_scoring``: the
  no-gradient forward over its peer rows (`_row_logps`), and ``train``: forward + backward over all its rows, an AdamW
  update every `gradient_accumulation_steps` micro-batches.

Own and peer rows are padded together to the widest row of either, as `append_peer_rows` does. Completion lengths are
log-normal, capped at `max_completion_length`: reasoning traces have a long right tail and a few hit the cap
(truncated). The shape is chosen, not fitted to a data set: median = cap / 8 and sigma = 1 (own rows) and median =
cap / 5 (peer rows, a more verbose agent), so the 90th percentile is ~3.6x the median and ~3% (own) to ~8% (peer) of
the rows are truncated at the cap; prompts are 40-160 tokens. Settings alternate within each repetition (off, on,
on, off, ...), so load from other processes on a shared machine hits both alike; the load average is printed beside
each repetition. The step-time ratio is padded ÷ trimmed of the median repetitions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl.trainer.utils import add_fused_lm_head, pad

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
from _common import provenance, write_section  # noqa: E402

from hacpo_trl.run import padding  # noqa: E402
from hacpo_trl.trainer import HACPOTrainer  # noqa: E402

PASSES = ("old_logps", "ref_logps", "peer_scoring", "train")
SETTINGS = ("padded", "trimmed", "grouped")
LABELS = {
    "padded": "padded (`trim_padding: false`, before issue 20)",
    "trimmed": "trimmed (`trim_padding: true`)",
    "grouped": "trimmed + `group_by_length: true`",
}
VOCAB, PAD_ID = 2048, 0


def model(hidden: int, layers: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=8192, pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )  # fmt: skip
    m = Qwen2ForCausalLM(config)
    add_fused_lm_head(m)
    return m


def lengths(n: int, median: float, sigma: float, cap: int, gen: torch.Generator) -> list[int]:
    z = torch.randn(n, generator=gen)
    return [max(1, min(cap, int(median * float(torch.exp(sigma * x))))) for x in z]


def layout(prompt_lens: list[int], completion_lens: list[int], gen: torch.Generator) -> dict:
    """TRL's batch layout for rows of these lengths: prompts left-padded, completions right-padded."""
    prompts = [torch.randint(1, VOCAB, (n,), generator=gen) for n in prompt_lens]
    completions = [torch.randint(1, VOCAB, (n,), generator=gen) for n in completion_lens]
    return {
        "prompt_ids": pad(prompts, padding_value=PAD_ID, padding_side="left"),
        "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
        "completion_ids": pad(completions, padding_value=PAD_ID, padding_side="right"),
        "completion_mask": pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right"),
    }


def trainer(m, trim: bool, group: bool, batch_size: int, ga: int, steps: int) -> HACPOTrainer:
    """The trainer's forward hooks without a launch (what they read: the model, the settings, the metric store)."""
    t = object.__new__(HACPOTrainer)
    t.args = SimpleNamespace(trim_padding=trim, group_by_length=group, per_device_train_batch_size=batch_size)
    t.args.gradient_accumulation_steps, t.args.steps_per_generation, t.args.share_rollouts = ga, steps, True
    t.accelerator = SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True, device=torch.device("cpu"))
    t.model = m
    t._forward_pass, t._generation_forwards = "other", 0
    t._padding_sums = {"train": {}, "eval": {}}
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return t


def step(t: HACPOTrainer, own: dict, both: dict, batch_size: int, ga: int, optim) -> None:
    """One generation batch's forwards and backwards, in the trainer's order."""
    m = t.model
    if t.args.group_by_length:
        both = padding.group_by_length(both, t.args.steps_per_generation, ga, t.args.share_rollouts)
    t._own_old_logps(own)
    ids = torch.cat([own["prompt_ids"], own["completion_ids"]], 1)
    mask = torch.cat([own["prompt_mask"], own["completion_mask"]], 1)
    with torch.no_grad(), t._pass("ref_logps"):
        t._get_per_token_logps_and_entropies(m, ids, mask, own["completion_ids"].size(1), batch_size=batch_size)
    rows = both["completion_ids"].size(0)
    micro = 2 * batch_size  # own and peer rows: n_agents x per_device_train_batch_size per forward
    for i, start in enumerate(range(0, rows, micro)):
        mb = {k: v[start : start + micro] for k, v in both.items()}
        is_peer = mb["hacpo_is_peer"]
        if is_peer.any():
            with torch.no_grad(), t._pass("peer_scoring"):
                t._row_logps(m, mb, is_peer)
        with t._pass("train"):
            logps = t._row_logps(m, mb, torch.ones_like(is_peer))
        cmask = mb["completion_mask"]
        loss = -((logps * cmask).sum(-1) / cmask.sum(-1)).mean() / ga
        loss.backward()
        if (i + 1) % ga == 0:
            optim.step()
            optim.zero_grad()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument(
        "--rows", type=int, default=16, help="own rows per rank and generation batch (and as many peer rows)"
    )
    parser.add_argument("--max_completion_length", type=int, default=1024)
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "studies" / "padding" / "RESULTS.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.repetitions = 2
    torch.set_num_threads(args.threads)
    cap, b, ga = args.max_completion_length, args.per_device_train_batch_size, args.gradient_accumulation_steps

    gen = torch.Generator().manual_seed(0)
    own_c = lengths(args.rows, cap / 8, 1.0, cap, gen)
    peer_c = lengths(args.rows, cap / 5, 1.0, cap, gen)
    prompt = [int(x) for x in torch.randint(40, 161, (args.rows,), generator=gen)]
    own = layout(prompt, own_c, gen)
    peer = layout(prompt, peer_c, gen)
    width = max(own["prompt_ids"].size(1), peer["prompt_ids"].size(1)), max(own_c + peer_c)
    both = {
        "prompt_ids": torch.cat([pad_to(x["prompt_ids"], width[0], PAD_ID, "left") for x in (own, peer)]),
        "prompt_mask": torch.cat([pad_to(x["prompt_mask"], width[0], 0, "left") for x in (own, peer)]),
        "completion_ids": torch.cat([pad_to(x["completion_ids"], width[1], PAD_ID, "right") for x in (own, peer)]),
        "completion_mask": torch.cat([pad_to(x["completion_mask"], width[1], 0, "right") for x in (own, peer)]),
        "hacpo_is_peer": torch.arange(2 * args.rows) >= args.rows,
        "hacpo_valid": torch.ones(2 * args.rows, dtype=torch.bool),
    }
    steps = 2 * args.rows // (2 * b)  # micro-batches per generation batch (steps_per_generation)

    m = model(args.hidden, args.layers)
    optim = torch.optim.AdamW(m.parameters(), lr=1e-6)
    settings = {s: trainer(m, s != "padded", s == "grouped", b, ga, steps) for s in SETTINGS}
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    started = time.perf_counter()
    step(settings["trimmed"], own, both, b, ga, optim)  # warm-up, not counted
    settings["trimmed"]._padding_sums = {"train": {}, "eval": {}}
    reps = []
    for r in range(args.repetitions):
        order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
        load = os.getloadavg()[0]
        rep = {}
        for name in order:
            t0 = time.perf_counter()
            step(settings[name], own, both, b, ga, optim)
            rep[name] = time.perf_counter() - t0
            times[name].append(rep[name])
        reps.append((load, rep))
        print(f"rep {r}: load {load:.1f}, " + ", ".join(f"{k} {v:.2f} s" for k, v in rep.items()), flush=True)
    elapsed = time.perf_counter() - started

    def ratios(name: str) -> dict[str, float]:
        sums = settings[name]._padding_sums["train"]
        out = {name: padding.padding_ratio(*sums[name]) for name in PASSES}
        out["all"] = padding.padding_ratio(sum(s[0] for s in sums.values()), sum(s[1] for s in sums.values()))
        return out

    pad_ratio = {name: ratios(name) for name in SETTINGS}
    median = {name: statistics.median(times[name]) for name in SETTINGS}

    def paired(name: str) -> str:
        values = [rep["padded"] / rep[name] for _, rep in reps]
        return f"{min(values):.2f}-{max(values):.2f}"

    loads = [load for load, _ in reps]
    real = sum(own_c) + sum(peer_c)
    lines = [
        "## Padding: long-tailed completion lengths, padded vs trimmed forwards (`benchmarks/studies/padding/padding.py`)",
        "",
        provenance("studies/padding/padding.py", sys.argv[1:] if argv is None else argv, elapsed),
        "",
        f"One rank's generation batch: {args.rows} own + {args.rows} peer rows, completion lengths log-normal "
        f"(sigma 1, median {cap // 8} own / {cap // 5} peer tokens, capped at {cap}: mean {statistics.mean(own_c):.0f} "
        f"/ {statistics.mean(peer_c):.0f}, longest {max(own_c)} / {max(peer_c)}, {sum(c >= cap for c in own_c + peer_c)} "
        f"of {2 * args.rows} rows at the cap), prompts 40-160 tokens; {real} completion tokens. "
        f"`per_device_train_batch_size` {b} (old / reference chunks of {b} rows, {2 * b}-row training micro-batches), "
        f"an AdamW update every {ga} micro-batches. Model: Qwen2 architecture, hidden {args.hidden}, {args.layers} "
        f"layers, vocabulary {VOCAB}, fp32, {args.threads} thread(s). {args.repetitions} repetitions, settings "
        "alternating within each; 1-minute load average during the repetitions: "
        f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores (other engineers' jobs).",
        "",
        "| setting | " + " | ".join(f"padding ratio: {p}" for p in (*PASSES, "all")) + " | step s (median) "
        "| step-time ratio padded ÷ this (per repetition) |",
        "|---|" + "---|" * (len(PASSES) + 3),
        *[
            f"| {LABELS[name]} | "
            + " | ".join(f"{pad_ratio[name][p]:.2f}" for p in (*PASSES, "all"))
            + f" | {median[name]:.2f} | **{median['padded'] / median[name]:.2f}** ({paired(name)}) |"
            for name in SETTINGS
        ],
        "",
        "Padding ratio: tokens the pass's forwards processed ÷ its real tokens (`hacpo/time/padding_ratio/<pass>`, "
        "logged by every run). Trimmed alone, the *train* and *peer_scoring* passes keep some padding: a micro-batch "
        "is fixed by the optimizer update it belongs to, and one forward over it must stay one forward (FSDP / "
        "ZeRO-3), so rows of different lengths share it; the no-gradient passes over a generation batch chunk rows "
        "by length. `group_by_length` regroups rows of equal weight within each update (same update, see "
        "`hacpo_trl.run.padding.length_groups`).",
        "",
    ]
    write_section(args.results, "padding", lines)
    print("\n".join(lines))
    return 0


def pad_to(x: torch.Tensor, width: int, value: int, side: str) -> torch.Tensor:
    extra = width - x.size(1)
    return torch.nn.functional.pad(x, (extra, 0) if side == "left" else (0, extra), value=value)


if __name__ == "__main__":
    sys.exit(main())
