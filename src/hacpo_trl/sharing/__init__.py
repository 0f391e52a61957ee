"""The sharing policy, whom a learner learns from and how (none of it in the paper but the loss): the named modes
(`presets`), each learner's settings, declared and checked once (`settings`), the decision at each generation batch
(`decision`), the learner's peer rows (`peer_rows`) with the peers' completions re-tokenized (`retokenize`), and the
loss over them (`peer_loss`). May import `algorithm` and `run`. Torch-free at import: `presets`, `settings`,
`retokenize` (the recipe checks and `--plan` read them before any ML library loads).
"""
