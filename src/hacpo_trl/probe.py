"""`python -m hacpo_trl.probe`: hacpo-probe: whether the agents of a recipe can learn from each other (`hacpo_trl.launch.probe`).

Kept at this path for the command line only (docs and recipes launch `-m hacpo_trl.probe`); import
`hacpo_trl.launch.probe` instead.
"""

from hacpo_trl.launch.probe import cli

if __name__ == "__main__":
    cli()
