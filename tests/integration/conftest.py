"""Integration tests: everything under tests/integration is marked `integration` automatically.

The cluster fixtures (`testbed`, `namespace`, `kubectl`, `api_client`, `core_v1`, `batch_v1`,
`wait_for`) come from tests/conftest.py; see docs/testbed.md.
"""

from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items, so restrict it to this directory.
    for item in items:
        if HERE in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)
