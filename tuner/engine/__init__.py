"""Running a model under a policy.

The function-mode engine, module tracker, native regions, attach/detach, the autocast probe.
"""
