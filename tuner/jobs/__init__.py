"""Whole commands as library calls (what the CLI runs): tune into a folder, check a plan, inspect a model."""
