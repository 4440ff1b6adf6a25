"""The `mpt` command-line app (click). Everything that computes lives in `tuner`."""
