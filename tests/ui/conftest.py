"""The browser fixtures live in tests/utils/browser.py (registered for the whole suite)."""

from tests.utils.browser import shot

__all__ = ["shot"]
