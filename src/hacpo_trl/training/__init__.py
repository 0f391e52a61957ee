"""What `HACPOTrainer` (`hacpo_trl.trainer`) needs beside TRL, each part tested without a trainer: an agent's model,
tokenizer and LoRA resolved and checked (`loading`), what a step logs (`metrics`), and the HACPO section of an
agent's model card (`model_card`). May import `algorithm`, `run`, `generation`, `sharing`, `agents` and `config`;
the trainer imports it, never the reverse.
"""
