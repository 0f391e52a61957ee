"""hacpo_trl.launch."""
