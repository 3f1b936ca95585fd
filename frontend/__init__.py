"""The pages (HTML, CSS, ES modules): a top-level folder of the checkout, shipped in the wheel as
`tunedeck.frontend` (pyproject maps the package onto this folder) and found with importlib.resources."""
