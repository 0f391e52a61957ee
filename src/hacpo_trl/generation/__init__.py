"""hacpo_trl.generation."""
