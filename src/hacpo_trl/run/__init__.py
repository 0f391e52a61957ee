"""The run's machinery, below every policy: a recipe's agents read once (`resolve`), which process trains which agent
on which GPUs (`placement`), one accelerate world per agent and the exchange group across them (`topology`), what
travels over it (`exchange`), how a generation batch is cut into micro-batches and optimizer updates (`schedule`,
`updates`), forwards at their rows' own width (`padding`), joint checkpoints (`checkpoints`) and the console's last
line under a launcher (`last_line`). May import nothing of the package outside it. Torch-free at import: `resolve`,
`placement`, `schedule`, `checkpoints`, `last_line` (the placement and the checks before any ML library loads run
them).
"""
