"""`python -m hacpo_trl.train`: hacpo-train: train every agent of a recipe in one launch (`hacpo_trl.launch.train`).

Kept at this path for the command line only (docs and recipes launch `-m hacpo_trl.train`); import
`hacpo_trl.launch.train` instead.
"""

from hacpo_trl.launch.train import cli

if __name__ == "__main__":
    cli()
