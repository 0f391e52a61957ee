"""One probe batch per agent, then the trainer's own loss on that batch: the per-row peer ratios of both.

    accelerate launch --multi_gpu --num_processes 2 tests/scripts/probe_vs_trainer.py OUT --config RECIPE ...

Each process writes OUT/ratios-<global rank>.json: the probe's ratio of every valid peer row and the ratios the
trainer logs for the same rows (`HACPOTrainer._collect_peer_ratios`, in batch order) in its first update (m = 0).
"""

import json
import os
import sys

from hacpo_trl.probe import _my_prompts, build_trainer, probe_batch
from hacpo_trl.topology import exit_process

out, argv = sys.argv[1], sys.argv[2:]
trainer, probe_args = build_trainer(argv)
acc = trainer.accelerator
prompts = _my_prompts(trainer.train_dataset, probe_args.prompts, acc.process_index, acc.num_processes)
batch, records, rows, ratios = probe_batch(trainer, prompts)
n_self = int((~batch["hacpo_is_peer"]).sum())
valid = batch["hacpo_valid"][n_self : n_self + len(rows)].tolist()

logged = []
trainer._collect_peer_ratios = lambda r, lower_bound: logged.append((r.tolist(), lower_bound))
trainer._step = 0  # the first update of the generation batch: m = 0
trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
trainer._compute_loss(trainer.model, batch)
result = {
    "agent": trainer.agent,
    "probe": [float(r) for r, v in zip(ratios.tolist(), valid, strict=True) if v],
    "trainer": logged[0][0],
    "lower_bound": logged[0][1],
}
with open(os.path.join(out, f"ratios-{trainer.topology.global_rank}.json"), "w") as f:
    json.dump(result, f)
trainer.topology.shutdown()
exit_process(0)
