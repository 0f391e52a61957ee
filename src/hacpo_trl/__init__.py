"""HACPO for TRL."""
