"""hacpo_trl.run."""
