"""Every option of every command, defined once: the options dataclasses and the YAML config schema derived from them."""
