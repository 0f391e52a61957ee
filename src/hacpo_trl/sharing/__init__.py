"""hacpo_trl.sharing.decision."""
