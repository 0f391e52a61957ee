"""hacpo_trl.agents."""
