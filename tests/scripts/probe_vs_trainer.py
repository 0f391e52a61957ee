"""The probe on a recipe, then the trainer's own loss on the probe's generation batch: the per-row peer ratios of
both, and every row of the batch as token ids.

    accelerate launch --multi_gpu --num_processes 2 tests/scripts/probe_vs_trainer.py OUT --config RECIPE ...

Runs `hacpo_trl.launch.probe.run` as `hacpo-probe` does (global rank 0 prints the table and writes ``--output``), then
each process writes OUT/ratios-<global rank>.json: the probe's ratio of every valid peer row and the ratios the
trainer logs for the same rows (`HACPOTrainer._collect_peer_ratios`, in batch order) in its first update (m = 0),
and OUT/rows-<global rank>.json: its own rows (prompt and completion ids without padding) and its peer rows (the same
in the learner's tokens, the generator's mean log-prob and token count, the source and the probe's ratio), for a
check by hand.
"""

import json
import os
import sys

from hacpo_trl.launch import probe
from hacpo_trl.run.topology import exit_process

out, argv = sys.argv[1], sys.argv[2:]
trainer, probe_args = probe.build_trainer(argv)
captured = []
probe_batch = probe.probe_batch
probe.probe_batch = lambda *a: captured.append(probe_batch(*a)) or captured[-1]
probe.run(trainer, probe_args)
batch, records, rows, ratios = captured[0]
n_self = int((~batch["hacpo_is_peer"]).sum())
valid = batch["hacpo_valid"][n_self : n_self + len(rows)].tolist()


def ids(key: str, i: int) -> list[int]:
    return batch[key][i][batch[key.replace("_ids", "_mask")][i].bool()].tolist()


rows_file = {
    "agent": trainer.agent,
    "own": [{"prompt": ids("prompt_ids", i), "completion": ids("completion_ids", i)} for i in range(n_self)],
    "peer": [
        {
            "prompt": ids("prompt_ids", n_self + i),
            "completion": ids("completion_ids", n_self + i),
            "old_mean_logp": float(batch["hacpo_old_mean_logp"][n_self + i]),
            "old_len": int(batch["hacpo_old_len"][n_self + i]),
            "source": source,
            "ratio": float(ratios[i]),
        }
        for i, source in enumerate(rows.sources)
    ],
}
with open(os.path.join(out, f"rows-{trainer.topology.global_rank}.json"), "w") as f:
    json.dump(rows_file, f)

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
