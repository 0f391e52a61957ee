"""A real HACPO run of tiny offline agents, launched by the tests with `accelerate launch`.

Each process writes `<out>/summary-<global rank>.json` with what the tests assert on.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback

from hacpo_trl import AgentSpec, HACPOConfig, HACPOTrainer
from hacpo_trl.agents.builtin import resolve_model
from hacpo_trl.agents.tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2
from hacpo_trl.run.topology import exit_process
from hacpo_trl.tasks.data import arithmetic_splits
from hacpo_trl.tasks.rewards import arithmetic_exact_match

parser = argparse.ArgumentParser()
parser.add_argument(
    "--agents",
    default="llama:1,qwen:1",
    help="kind:num_processes[:lora], in launch order; kind llama, qwen or builtin=NAME",
)
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--no_share", action="store_true")
parser.add_argument("--save_steps", type=int, default=0)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--resume_step", action="append", default=[], help="i:step, agent i resumes from checkpoint-<step>")
parser.add_argument(
    "--resume_path", default=None, help="every agent is given this resume_from_checkpoint, as a CLI flag"
)
parser.add_argument("--base_seed", action="append", default=[], help="i:seed, agent i's random base model's seed")
parser.add_argument("--generation_batch", type=int, default=8)
parser.add_argument("--steps_per_generation", type=int, default=2)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--logging_steps", type=int, default=1)
parser.add_argument("--delta", type=float, default=0.2)
parser.add_argument("--trace_params", action="store_true", help="record the weights' sum after every step")
parser.add_argument("--delta_step", type=float, default=0.025, help="peer_delta_step (0: the band stays fixed)")
parser.add_argument("--override", action="append", default=[], help="i:key=json, a setting for agent i only")
parser.add_argument("--report_to", default="none")
parser.add_argument("--fail_reward", type=int, default=-1, help="agent i's reward raises at its 2nd call")
parser.add_argument("--hang_reward", type=int, default=-1, help="agent i's reward hangs at its 2nd call")
parser.add_argument("--hang_at_call", type=int, default=2, help="the reward call that --hang_reward hangs in")
parser.add_argument("--die_at_step", default="", help="i:step, agent i's process SIGKILLs itself after that step")
parser.add_argument("--die_while_saving", default="", help="i:step, agent i is SIGKILLed halfway through that save")
parser.add_argument("--save_total_limit", type=int, default=None)
parser.add_argument("--exchange_timeout", type=float, default=120)
parser.add_argument("--exchange_startup_timeout", type=float, default=3600)
parser.add_argument("--push", action="store_true", help="push every agent to <HF_ENDPOINT>/tester/<agent>")
parser.add_argument("--other_prompts", type=int, default=-1, help="give agent i a different dataset")
parser.add_argument("--stop_on_digits", action="store_true", help="digits are stop tokens as well as EOS")
parser.add_argument("--fsdp", action="store_true", help="FSDP2 inside each agent's world (on CPU, see cpu_fsdp)")
parser.add_argument("--peer_filter", default=None, help="default: the sharing mode's ('all' for the paper's)")
parser.add_argument("--sharing", default=None, help="the run's named sharing mode (default: the paper's rule)")
parser.add_argument(
    "--correct_on_rank0",
    action="store_true",
    help="only completions made on an agent's rank 0 are correct (reward > 0): with peer_filter=correct, the ranks "
    "of one agent then keep different numbers of peer rows",
)
parser.add_argument("--record_forwards", action="store_true", help="each forward's pass name and rows")
parser.add_argument(
    "--engine_scheduler",
    action="store_true",
    help="the learning-rate schedule owned by the engine, as DeepSpeed's with a scheduler block: the Trainer's step "
    "is a no-op and the real schedule steps inside the backward call of an update's last micro-batch",
)
parser.add_argument(
    "--record_layout",
    action="store_true",
    help="own / peer / padding rows of each micro-batch, and whether it holds TRL's old log-probs (1 or 0)",
)
parser.add_argument(
    "--grad_scaler",
    action="store_true",
    help="torch's GradScaler in the optimizer steps, as fp16 mixed precision on an accelerator uses it (accelerate "
    "refuses fp16 on the CPU, so the test sets the scaler it would have made)",
)
parser.add_argument("--eval_steps", type=int, default=0, help="TRL's own evaluation every N optimizer steps")
parser.add_argument("--zero_reward", type=int, default=-1, help="agent i solves nothing: every reward 0 (P̂ = 0)")
parser.add_argument(
    "--first_of_group",
    action="store_true",
    help="a completion is right iff it is the first of its prompt's group (TRL scores a group's completions "
    "consecutively), whatever was sampled: every group has a spread of rewards by construction, so every update of "
    "own rows has a learning signal and P̂ = 1/2 (with --correct_on_rank0: 1 and 0.5 on rank 0, 0 elsewhere; "
    "--zero_reward wins)",
)
parser.add_argument(
    "--fail_odd_groups",
    default="",
    help="i:step, with --first_of_group: from optimizer step `step` on, agent i fails every completion of the 2nd, "
    "4th, ... group of each generation batch (half its prompts failed, the others keep their spread)",
)
parser.add_argument("--task", default="digits", help="digits (4x4 sums, any digit scores) or arithmetic (built-in)")
parser.add_argument("--lora_targets", default="q_proj,v_proj")
parser.add_argument("--max_completion_length", type=int, default=8)
parser.add_argument("--learning_rate", type=float, default=None, help="every agent's (default: for random tiny ones)")
parser.add_argument("--record_peers", action="store_true", help="write the peer rows of the first step")
opts = parser.parse_args()
node_rank = os.environ.get("GROUP_RANK")  # the launcher's machine rank (the rank variables are rewritten below)

specs, builders = [], {}
for i, item in enumerate(opts.agents.split(",")):
    kind, procs, *flags = item.split(":")
    name = f"{kind.split('=')[-1]}{i}"
    extra = {
        k: json.loads(v)
        for j, kv in (o.split(":", 1) for o in opts.override)
        if int(j) == i
        for k, v in [kv.split("=", 1)]
    }
    lora = {"r": 4, "lora_alpha": 8, "target_modules": opts.lora_targets.split(",")} if "lora" in flags else None
    specs.append(
        AgentSpec(
            name=name,
            num_processes=int(procs),
            lora=lora,
            hub_model_id=f"tester/{name}" if opts.push else None,
            learning_rate=opts.learning_rate or (0.05 if lora is None else 0.2),
            overrides={
                "per_device_train_batch_size": opts.generation_batch // opts.steps_per_generation // int(procs),
                **extra,
            },
        )
    )
    builders[name] = kind

if opts.fsdp:
    from cpu_fsdp import enable_cpu_fsdp

    enable_cpu_fsdp()

args = HACPOConfig(
    output_dir=opts.out,
    agents=specs,
    use_cpu=True,
    bf16=False,
    num_generations=2,
    steps_per_generation=opts.steps_per_generation,
    gradient_accumulation_steps=opts.gradient_accumulation_steps,
    max_completion_length=opts.max_completion_length,
    max_steps=opts.steps,
    logging_steps=opts.logging_steps,
    report_to=opts.report_to.split(","),
    push_to_hub=opts.push,
    gradient_checkpointing=False,
    save_strategy="steps" if opts.save_steps else "no",
    save_steps=opts.save_steps or 500,
    save_total_limit=opts.save_total_limit,
    share_rollouts=False if opts.no_share else None,  # None: as the sharing mode says (the paper's: True)
    sharing=opts.sharing,
    seed=int(os.environ.get("HACPO_TEST_SEED", "0") or 0),  # the suite's seed knob (tests/helpers.py)
    exchange_timeout=opts.exchange_timeout,
    exchange_startup_timeout=opts.exchange_startup_timeout,
    peer_delta=opts.delta,
    peer_delta_step=opts.delta_step,
    lr_scheduler_type="constant",
    peer_filter=opts.peer_filter,
    **({"eval_strategy": "steps", "eval_steps": opts.eval_steps} if opts.eval_steps else {}),
)

# Each agent starts from a saved base model, as a real run would (LoRA adapters then record their base).
kind = builders[args.agent_name]
base = os.path.join(opts.out, "bases", args.agent_name)
if kind.startswith("builtin="):  # a built-in agent (or real pretrained model) from the hacpo cache
    base = kind.replace("=", ":")
    if int(os.environ["RANK"]) == 0:
        resolve_model(base)  # the agent's own rank 0 builds or converts it once
elif int(os.environ["RANK"]) == 0 and not os.path.isdir(base):  # the agent's own rank 0
    tok = char_tokenizer() if kind == "llama" else bpe_tokenizer()
    seeds = [int(s) for i, _, s in (v.partition(":") for v in opts.base_seed) if specs[int(i)].name == args.agent_name]
    seed = seeds[0] if seeds else (1 if kind == "llama" else 2)
    model = tiny_llama(tok, seed=seed) if kind == "llama" else tiny_qwen2(tok, seed=seed)
    if opts.stop_on_digits:  # digits end a completion too (like EOS), so that many completions finish in 8 tokens
        model.generation_config.eos_token_id = [tok.eos_token_id, *tok.convert_tokens_to_ids(list("0123456789"))]
    model.save_pretrained(base)
    tok.save_pretrained(base)
if torch.distributed.is_initialized():
    torch.distributed.barrier()  # the agent's world only

offset = 5 if specs[opts.other_prompts].name == args.agent_name and opts.other_prompts >= 0 else 0
prompts = [[{"role": "user", "content": f"{a + offset}+{b}="}] for a in range(4) for b in range(4)]
dataset = Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a in range(4) for b in range(4)]})
if opts.task == "arithmetic":
    dataset = arithmetic_splits()["train"]


me = [s.name for s in specs].index(args.agent_name)
calls = []


def has_digit(completions, **kwargs):
    calls.append(1)
    if len(calls) == 2 and opts.fail_reward == me:
        raise RuntimeError("reward exploded")
    if len(calls) == opts.hang_at_call and opts.hang_reward == me:
        time.sleep(600)
    if opts.zero_reward == me:
        return [0.0] * len(completions)
    if opts.first_of_group:  # by construction, whatever was sampled (see the option's help)
        n, step = args.num_generations, kwargs["trainer_state"].global_step
        failing = any(step >= s for s in my_steps(opts.fail_odd_groups))
        right = [i % n == 0 and not (failing and (i // n) % 2) for i in range(len(completions))]
        if opts.correct_on_rank0:
            return [(1.0 if r else 0.5) * (int(os.environ["RANK"]) == 0) for r in right]
        return [float(r) for r in right]
    if opts.correct_on_rank0:  # rank 0: every completion correct (but not equally good); other ranks: none
        on_rank0 = int(os.environ["RANK"]) == 0  # the agent-local rank
        return [(1.0 if any(ch.isdigit() for ch in c[0]["content"]) else 0.5) * on_rank0 for c in completions]
    if opts.task == "arithmetic":
        return arithmetic_exact_match(completions, **kwargs)
    return [1.0 if any(ch.isdigit() for ch in c[0]["content"]) else 0.0 for c in completions]


def my_steps(*values: str) -> set[int]:
    """The steps that `i:step` options name for this agent."""
    return {int(s) for i, _, s in (v.partition(":") for v in values if v) if int(i) == me}


class DieAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in my_steps(opts.die_at_step):
            os.kill(os.getpid(), signal.SIGKILL)


param_trace = []  # the weights' sum after every optimizer step: which steps moved them


class TraceParams(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        param_trace.append(float(sum(p.detach().double().abs().sum() for p in model.parameters())))


callbacks = [DieAt(), TraceParams()] if opts.trace_params else [DieAt()]
forwards = []  # (pass, rows) of every forward TRL's log-prob function runs, in order (`--record_forwards`)
if opts.record_forwards:
    import trl

    trl_logps = trl.GRPOTrainer._get_per_token_logps_and_entropies

    def recording_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, *rest, **kw):
        n = input_ids.shape[0]
        size = batch_size or n  # TRL's own chunks when HACPO passes it a batch size (untrimmed forwards)
        forwards.extend([self._forward_name, min(size, n - i)] for i in range(0, n, size))
        return trl_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, *rest, **kw)

    trl.GRPOTrainer._get_per_token_logps_and_entropies = recording_logps
trainer = HACPOTrainer(
    model=base, reward_funcs=has_digit, args=args, train_dataset=dataset, callbacks=callbacks,
    eval_dataset=dataset.select(range(4)) if opts.eval_steps else None,
)  # fmt: skip
layouts = []  # per training generation batch: [own, peer, padding] rows of each micro-batch, None = skipped
if opts.record_layout:
    prepare_inputs = trainer._prepare_inputs

    def recording_prepare_inputs(generation_batch):
        buffered = trainer._buffered_inputs
        out = prepare_inputs(generation_batch)
        if trainer.model.training and trainer._buffered_inputs is not buffered:  # a new generation batch
            layouts.append([
                None if mb is None else (
                    [int((~mb["hacpo_is_peer"]).sum()), int((mb["hacpo_is_peer"] & mb["hacpo_valid"]).sum()),
                     int((mb["hacpo_is_peer"] & ~mb["hacpo_valid"]).sum())]
                    if "hacpo_is_peer" in mb else [int(mb["completion_ids"].shape[0]), 0, 0]
                ) + [int("old_per_token_logps" in mb)]
                for mb in trainer._buffered_inputs
            ])  # fmt: skip
        return out

    trainer._prepare_inputs = recording_prepare_inputs
engine_schedule = []  # the engine-owned schedule (`--engine_scheduler`), to read its step count at the end
if opts.engine_scheduler:
    from accelerate.utils.deepspeed import DeepSpeedSchedulerWrapper

    create_scheduler = trainer.create_scheduler

    def engine_owned_scheduler(num_training_steps, optimizer=None):
        inner = create_scheduler(num_training_steps, optimizer)
        engine_schedule.append(inner)
        trainer.lr_scheduler = DeepSpeedSchedulerWrapper(inner, trainer.optimizer)  # its step() does nothing
        backward = trainer.accelerator.backward

        def backward_stepping_the_schedule(loss, **kwargs):  # accelerate's DeepSpeed backward: engine.step() there
            backward(loss, **kwargs)
            if trainer.accelerator.sync_gradients:
                inner.step()

        trainer.accelerator.backward = backward_stepping_the_schedule
        return trainer.lr_scheduler

    trainer.create_scheduler = engine_owned_scheduler
peer_log = {}
if opts.record_peers:  # what the learner built from its peers' records at the first step, as token ids
    unrecorded_add_peer_rows = trainer._add_peer_rows  # its own name: `add_peer_rows` is rebound below

    def recording_add_peer_rows(batch, rows, prompt_ids, *rest):
        batch = unrecorded_add_peer_rows(batch, rows, prompt_ids, *rest)
        records = trainer.last_records  # every agent's rollouts of this batch
        if not peer_log:
            peer = batch["hacpo_is_peer"] & batch["hacpo_valid"]
            mine = set(prompt_ids)
            peer_log["records"] = [
                (r.agent, pid, text, term)
                for r in records
                if r.agent != args.agent_name
                for pid, text, term in zip(r.prompt_ids, r.texts, r.terminated, strict=True)
                if pid in mine
            ]
            peer_log["self_prompts"] = {pid: batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
                                        for i, pid in enumerate(prompt_ids)}  # fmt: skip
            peer_log["rows"] = [
                (batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist(),
                 batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist())
                for i in peer.nonzero().flatten().tolist()
            ]  # fmt: skip
        return batch

    trainer._add_peer_rows = recording_add_peer_rows
if my_steps(opts.die_while_saving):
    save_rng_state = trainer._save_rng_state  # runs after the weights and optimizer are written, before the rest

    def dying_save_rng_state(output_dir):
        if trainer.state.global_step in my_steps(opts.die_while_saving):
            os.kill(os.getpid(), signal.SIGKILL)
        return save_rng_state(output_dir)

    trainer._save_rng_state = dying_save_rng_state
peer_rows_here = []  # peer rows this rank trains on, per generation batch
peer_rows_finished = []  # peer completions of this rank's prompts that ended in EOS, per generation batch
own_advantages = []  # (training generation batch, [(prompt, advantage) of each own row]) at batches with peer rows
peer_advantages = []  # (training generation batch, [(prompt, advantage, taught) of each peer row]) at the same
add_peer_rows = trainer._add_peer_rows


def counting_add_peer_rows(batch, rows, prompt_ids, *rest):
    finished = sum(
        done
        for r in trainer.last_records
        if r.agent != args.agent_name
        for pid, done in zip(r.prompt_ids, r.terminated, strict=True)
        if pid in prompt_ids
    )
    if trainer.model.training:
        own_advantages.append(
            (len(batch_rewards) - 1, list(zip(prompt_ids, rows.self_advantages.tolist(), strict=True)))
        )
        peer_advantages.append(
            (len(batch_rewards) - 1, list(zip(rows.prompt_ids, rows.advantages, rows.taught, strict=True)))
        )
    batch = add_peer_rows(batch, rows, prompt_ids, *rest)
    peer_rows_here.append(int((batch["hacpo_is_peer"] & batch["hacpo_valid"]).sum()))
    peer_rows_finished.append(finished)
    return batch


trainer._add_peer_rows = counting_add_peer_rows
batch_rewards = []  # every agent's (agent, prompt, reward) at each training generation batch, all ranks
update_capability = trainer._update_capability


def recording_update_capability(records, mode):
    if mode == "train":
        batch_rewards.append([(r.agent, p, x) for r in records for p, x in zip(r.prompt_ids, r.rewards, strict=True)])
    return update_capability(records, mode)


trainer._update_capability = recording_update_capability
before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
resume = True if opts.resume else opts.resume_path
for step in my_steps(*opts.resume_step):
    resume = os.path.join(args.output_dir, f"checkpoint-{step}")
if opts.grad_scaler:  # before train(): accelerate hands it to the optimizer it prepares there
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
trainer.train(resume_from_checkpoint=resume)
# under FSDP each rank holds a shard (a DTensor); compare whole parameters (`full_tensor` is a collective)
after = {n: p.full_tensor() if hasattr(p, "full_tensor") else p for n, p in trainer.model.named_parameters()}
trainable = [n for n, p in after.items() if p.requires_grad]
frozen = [n for n, p in after.items() if not p.requires_grad]
trainer.save_model()

scaler = trainer.accelerator.scaler
summary = {
    "agent": args.agent_name,
    "agent_world": trainer.accelerator.num_processes,
    "agent_rank": trainer.accelerator.process_index,
    "global_rank": trainer.topology.global_rank,
    "node_rank": node_rank,
    "local_rank": os.environ["LOCAL_RANK"],  # agent-local, on this machine
    "local_world_size": os.environ["LOCAL_WORLD_SIZE"],
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "output_dir": args.output_dir,
    "trainable_changed": [n for n in trainable if not before[n].equal(after[n].detach())],
    "trainable": trainable,
    "frozen_changed": [n for n in frozen if not before[n].equal(after[n].detach())],
    "log_history": trainer.state.log_history,
    "capability": trainer.capability.state_dict(),
    "global_step": trainer.state.global_step,
    "fsdp": trainer.is_fsdp_enabled,
    "sharded": sorted({type(p).__name__ for p in trainer.model.parameters()}),
    "peer_rows_here": peer_rows_here,
    "peer_rows_finished": peer_rows_finished,
    "own_advantages": own_advantages,
    "peer_advantages": peer_advantages,
    "param_sum": float(sum(p.detach().double().sum() for p in after.values())),
    "param_trace": param_trace,
    "peers": peer_log,
    "batch_rewards": batch_rewards,
    "forwards": forwards,
    "layouts": layouts,
    "engine_schedule_steps": engine_schedule[0].last_epoch if engine_schedule else None,
    "grad_scaler": scaler and {"enabled": scaler.is_enabled(), "scale": scaler.get_scale()},
    "base": base,
}
with open(os.path.join(opts.out, f"summary-{trainer.topology.global_rank}.json"), "w") as f:
    json.dump(summary, f, default=str)
print(f"done {args.agent_name}", file=sys.stderr)
trainer.topology.shutdown()
exit_process(0)
