"""Helpers shared by the tests: builders of test objects and harnesses (importable via
pytest's ``pythonpath``, never shipped)."""
