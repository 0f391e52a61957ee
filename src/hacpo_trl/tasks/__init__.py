"""What the agents train and are scored on: the built-in tasks and the datasets a recipe names (`data`), and the
verifiable rewards a recipe names (`rewards`). May import `run` and `sharing` (a reward reads a completion's text as
the learner's re-tokenization does). Torch-free at import: `rewards` (the recipe checks load the reward functions).
"""
