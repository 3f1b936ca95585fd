"""The shipped presets (job YAMLs, DeepSpeed JSONs): a top-level folder of the checkout, shipped in the
wheel as `tunedeck.configs` and found with importlib.resources."""
