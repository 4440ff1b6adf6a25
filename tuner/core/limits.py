"""Bounds the tune options are checked against, importable without torch (the CLI builds its options from them)."""

MIN_MAX_EVALS = 3  # the baseline twice (tuner.search.noise) + one trial
