"""The built-in policies, one per module."""
