"""`hacpo-train --plan`'s arithmetic: who runs where, how batches split and what each rank holds in memory (`plan`),
and how long each agent takes and the split of processes that waits least (`balance`). May import `run` and
`sharing`. Torch-free at import: `plan`, `balance` (pure Python, so that a GPU recipe is checked on a laptop).
"""
