"""What precision each op gets, as data: rules, op names, policies and presets, the Plan."""
