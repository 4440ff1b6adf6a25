"""One run's on-disk state: the output folder and its file names, lock, journal, model reference, the model keeper."""
