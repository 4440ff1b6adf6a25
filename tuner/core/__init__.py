"""The user-code boundary and shared values: loading the model file, ModelInputs, dtypes, fingerprints, YAML and atomic file IO, errors."""
