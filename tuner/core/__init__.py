"""The user-code boundary and shared values.

Loading the model file, ModelInputs, dtypes, fingerprints, YAML and atomic file IO, errors.
"""
