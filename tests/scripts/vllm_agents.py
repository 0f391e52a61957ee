"""The built-in vllm pair trained with HACPO, each agent generating with its own colocated vLLM engine (vLLM's CPU
build), launched by tests/test_vllm.py with `accelerate launch`, one process per agent.

Each process writes `<out>/vllm-<agent>.json`: its trained model's and its engine's log-probs of a fixed set of
completions (before training, after it, and the engine's after one more weight sync), the log history, its engine's
seed, and for each generation batch the log-probs TRL's vLLM importance sampling was computed from, with the rows'
prompts, completions and rewards.

The agents are rewarded for the right answer and, by construction, for being the first completion of their prompt's
group (`first_of_group`), so that every group has a spread of rewards whatever was sampled: every generation batch
then gives a learning signal and moves the weights, on any CPU and with any seed (``HACPO_TEST_SEED``).
"""

import argparse
import json
import os


def first_of_group(completions, trainer_state=None, **kwargs) -> list[float]:
    """1 for the first completion of each group of NUM_GENERATIONS (TRL scores a prompt's group consecutively), else
    0: a reward spread in every group by construction."""
    return [float(i % NUM_GENERATIONS == 0) for i in range(len(completions))]


NUM_GENERATIONS = 4
# the first of a group outweighs the right answer (0.75 >= the others' 0.25 at most), so every group has a spread;
# rewards stay in [0, 1], as `max_reward` expects
REWARD_WEIGHTS = [0.25, 0.75]


def completions(tok, count: int = 6) -> list[tuple[list[int], int]]:
    """``(prompt + completion ids, prompt length)``: held-out problems with their right answer and a wrong one."""
    from hacpo_trl.tasks.data import arithmetic_splits

    rows = arithmetic_splits()["test"].select(range(count // 2))
    seqs = []
    for row in rows:
        prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
        prompt = list(prompt["input_ids"])
        for answer in (row["answer"], str(int(row["answer"]) + 7)):
            seqs.append((prompt + tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id], len(prompt)))
    return seqs


def model_logps(model, seqs) -> list[list[float]]:
    """The trained model's log-prob of each completion token (temperature 1, as the recipe samples)."""
    import torch

    training = model.training
    model.eval()
    out = []
    with torch.no_grad():
        for ids, n in seqs:
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            logps = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
            out.append(logps[n - 1 :].tolist())
    model.train(training)
    return out


def engine_logps(llm, seqs) -> list[list[float]]:
    """The engine's log-prob of the same tokens (vLLM's prompt log-probs)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _ in seqs], params, use_tqdm=False)
    return [
        [o.prompt_logprobs[i][ids[i]].logprob for i in range(n, len(ids))]
        for o, (ids, n) in zip(outs, seqs, strict=True)
    ]


def record_importance_sampling(records: list) -> None:
    """Keep, for every generation batch, what TRL computed its vLLM importance-sampling ratio from (own rows), the
    own rows' prompts, completions, answers and rewards per reward function, and the ratio each row of HACPO's batch
    (own and peer rows) carries into the loss."""
    from trl import GRPOTrainer

    from hacpo_trl import HACPOTrainer

    trl_step, hacpo_step = GRPOTrainer._generate_and_score_completions, HACPOTrainer._generate_and_score_completions

    def trl_batch(self, inputs):
        batch = trl_step(self, inputs)
        if self.model.training:
            keys = ("old_per_token_logps", "sampling_per_token_logps", "completion_mask", "importance_sampling_ratio")
            record = {"step": self.state.global_step, **{k: batch[k].tolist() for k in keys}}
            record["prompt_ids"] = [x["hacpo_prompt_id"] for x in inputs]
            record["answers"] = [x["answer"] for x in inputs]
            record["completions"] = list(self._captured["completions"])
            record["rewards_per_func"] = self._captured["rewards_per_func"].tolist()
            records.append(record)
        return batch

    def hacpo_batch(self, inputs):
        batch = hacpo_step(self, inputs)
        if self.model.training:
            records[-1]["hacpo_ratio"] = batch["importance_sampling_ratio"].reshape(-1).tolist()
            records[-1]["hacpo_is_peer"] = batch["hacpo_is_peer"].tolist()
        return batch

    GRPOTrainer._generate_and_score_completions = trl_batch
    HACPOTrainer._generate_and_score_completions = hacpo_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --out")
    parser.add_argument("--lora", type=int, default=1, help="the agent (index) trained with LoRA; -1: none")
    opts = parser.parse_args()

    from hacpo_trl import AgentSpec, HACPOConfig, HACPOTrainer
    from hacpo_trl.agents.builtin import resolve_model
    from hacpo_trl.run.topology import exit_process
    from hacpo_trl.tasks.data import arithmetic_splits
    from hacpo_trl.tasks.rewards import arithmetic_exact_match

    specs = [
        AgentSpec(
            name=name,
            num_processes=1,
            lora={"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]} if i == opts.lora else None,
            learning_rate=1e-2 if i == opts.lora else 1e-3,
        )
        for i, name in enumerate(["vllm-llama", "vllm-qwen2"])
    ]
    args = HACPOConfig(
        output_dir=opts.out,
        agents=specs,
        use_cpu=True,
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=128,
        num_generations=NUM_GENERATIONS,
        reward_weights=REWARD_WEIGHTS,
        per_device_train_batch_size=8,
        steps_per_generation=2,
        max_completion_length=6,
        temperature=1.0,
        max_steps=opts.steps,
        logging_steps=1,
        save_strategy="steps" if opts.save_steps else "no",
        save_steps=opts.save_steps or 500,
        lr_scheduler_type="constant",
        report_to="none",
        seed=int(os.environ.get("HACPO_TEST_SEED", "0")),
    )
    path = resolve_model(f"builtin:{args.agent_name}")  # one process per agent: it builds its own
    records: list = []
    record_importance_sampling(records)
    trainer = HACPOTrainer(
        model=path,
        reward_funcs=[arithmetic_exact_match, first_of_group],
        args=args,
        train_dataset=arithmetic_splits()["train"],
    )
    seqs = completions(trainer.processing_class)
    before = model_logps(trainer.model, seqs)
    trainer.train(resume_from_checkpoint=opts.resume or None)
    after = model_logps(trainer.model, seqs)
    trainer.vllm_generation.sync_weights()
    llm = trainer.vllm_generation.llm
    summary = {
        "agent": args.agent_name,
        "lora": args.agent_spec.lora is not None,
        "before": before,
        "after": after,
        "engine": engine_logps(llm, seqs),
        "engine_seed": llm.llm_engine.vllm_config.model_config.seed,
        "engine_dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
        "log_history": trainer.state.log_history,
        "importance_sampling": records,
    }
    with open(os.path.join(opts.out, f"vllm-{args.agent_name}.json"), "w") as f:
        json.dump(summary, f)
    trainer.topology.shutdown()
    exit_process(0)


if __name__ == "__main__":  # vLLM spawns processes: the script must not run again in them
    main()
