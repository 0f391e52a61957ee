"""The commands and how a launch starts: `hacpo-train` (`train`, its `--plan` in `plan_cli`), `hacpo-probe`
(`probe`), `hacpo-eval` (`evaluate`), the one start-up of every command that builds agents (`start`), the recipe read
and checked (`recipe`), what every process does before a trainer exists (`bootstrap`), the console of a launch
(`progress`) and the trackers checked up front (`trackers`). The top layer. May import every layer below; nothing of
the library imports it but the `python -m hacpo_trl.<command>` shims. Torch-free at import: `recipe`, `bootstrap`,
`trackers`, `start`, `train`, `plan_cli` (a bad recipe is refused, and `--help` printed, before trl loads).
"""
