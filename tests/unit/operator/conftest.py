"""Operator unit tests import their builders module directly (pytest runs in importlib mode)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
