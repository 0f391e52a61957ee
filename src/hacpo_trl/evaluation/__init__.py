"""hacpo_trl.evaluation."""
