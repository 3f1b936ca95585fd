"""Test helpers: the app in this process (`App`) and row factories that go through our own services."""
