"""`python -m hacpo_trl.evaluate`: hacpo-eval: evaluate saved agents on held-out problems (`hacpo_trl.launch.evaluate`).

Kept at this path for the command line only (docs and recipes launch `-m hacpo_trl.evaluate`); import
`hacpo_trl.launch.evaluate` instead.
"""

from hacpo_trl.launch.evaluate import cli

if __name__ == "__main__":
    cli()
