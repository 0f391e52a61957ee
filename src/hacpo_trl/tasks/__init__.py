"""hacpo_trl.tasks.data."""
