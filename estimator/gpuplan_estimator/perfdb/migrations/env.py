"""Alembic environment: runs on the connection `PerfStore.open` passes in `config.attributes`."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from gpuplan_estimator.perfdb import tables


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=tables.Base.metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("gpuplan migrations run only through PerfStore.open (no connection)")
    _run(connection)


_main()
