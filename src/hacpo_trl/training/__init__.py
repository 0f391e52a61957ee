"""hacpo_trl.training."""
