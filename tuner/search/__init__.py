"""The accuracy-driven search: its types, strategy, noise rules, the tune session, torchrun coordination."""
