"""Cost and error of a forward pass: FLOPs, lower-precision shares, per-op inspection, ranking."""
