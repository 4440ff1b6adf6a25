"""Running a model under a policy: the function-mode engine, module tracker, native regions, attach/detach, the autocast probe."""
