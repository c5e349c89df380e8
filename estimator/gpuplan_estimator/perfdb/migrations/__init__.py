"""Alembic migrations of the performance database, applied by `PerfStore.open`."""
