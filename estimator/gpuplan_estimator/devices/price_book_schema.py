"""The price book's file schema (`price_book`), apart so that pydantic is imported when a book
is read, not by every `gpuplan` start that never prices by provider (#34)."""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpuplan_estimator.devices.prices import MAX_PRICE_USD_PER_HOUR

_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]
_Price = Annotated[float, Field(gt=0, le=MAX_PRICE_USD_PER_HOUR, allow_inf_nan=False)]


class ProviderEntry(BaseModel):
    """One provider's dated price list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Text
    source: _Text
    as_of: datetime.date
    prices: dict[_Text, _Price] = Field(min_length=1, max_length=256)


class PriceBookFile(BaseModel):
    """A price book: ``providers:`` by short name (``aws``, ``lambda``, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    providers: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_\-]{0,39}$")],
                    ProviderEntry] = Field(min_length=1, max_length=64)
