"""hacpo_trl.planning."""
