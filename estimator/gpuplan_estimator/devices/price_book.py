"""Prices by provider, one dated source each (#34): a plan compares GPUs within one provider.

The shipped book (`data/prices.yaml`) and a user's book share one schema: ``providers:``, each
with a ``name``, a ``source`` (URL or title), an ``as_of`` date and ``prices:`` (catalog key or
any name the catalog resolves → USD per GPU hour). Choosing a provider prices every device from
that provider alone; a device it does not list becomes unpriced, with a price source saying so.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpuplan_estimator.core import errors, paths
from gpuplan_estimator.devices.catalog import Catalog, with_prices
from gpuplan_estimator.devices.prices import MAX_PRICES_FILE_BYTES, read_prices_file

if TYPE_CHECKING:  # the schema (pydantic) is imported when a book is read: not at CLI start
    from gpuplan_estimator.devices.price_book_schema import PriceBookFile, ProviderEntry

SHIPPED_BOOK_PATH = paths.PACKAGE_DATA_DIR / "prices.yaml"
PROVIDERS_KEY = "providers"
PROVIDER_ENV = "GPUPLAN_PRICES_PROVIDER"
"""The provider the estimator service prices with (the chart's `pricesProvider`; unset: the
catalog's indicative prices)."""

def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "[key]")


def parse_price_book(document: Any, origin: str) -> PriceBookFile:
    """A parsed YAML/JSON document → the book; `InvalidRequestError` names the field path."""
    from pydantic import ValidationError

    from gpuplan_estimator.devices.price_book_schema import PriceBookFile

    try:
        return PriceBookFile.model_validate(document)
    except ValidationError as exc:
        details = tuple(f"{origin}: {_where(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise errors.InvalidRequestError("--prices", "; ".join(details), details) from None


def read_price_book(path: str | Path) -> PriceBookFile:
    """Read and validate a price book file (size-capped)."""
    file = Path(path)
    return parse_price_book(_read_document(file, "--prices"), str(file))


@functools.cache
def shipped_book() -> PriceBookFile:
    """The shipped book of published prices (read once)."""
    return read_price_book(SHIPPED_BOOK_PATH)


def is_price_book(document: Any) -> bool:
    """Whether a prices file is a book (``providers:``) rather than a ``prices:`` mapping."""
    return isinstance(document, Mapping) and PROVIDERS_KEY in document


def provider(book: PriceBookFile, name: str, field: str = "--prices") -> ProviderEntry:
    """The book's provider `name`; `InvalidRequestError` naming `field` and the known ones."""
    entry = book.providers.get(name)
    if entry is None:
        raise errors.InvalidRequestError(field, f"{name!r} is not a provider of the price "
                                         f"book; known: {', '.join(sorted(book.providers))}")
    return entry


def price_label(name: str, entry: ProviderEntry) -> str:
    """Where and when a provider's prices were taken, as every price of it says."""
    return f"{name}: {entry.name}, {entry.source}, as of {entry.as_of.isoformat()}"


def priced_by(catalog: Catalog, name: str, entry: ProviderEntry) -> Catalog:
    """`catalog` with every price from provider `name` alone: listed devices get its price and
    label, the others none (their price source says the provider does not list them)."""
    prices = {catalog.resolve(n).key: p for n, p in entry.prices.items()}
    label = price_label(name, entry)
    return Catalog(tuple(
        dataclasses.replace(d, price_per_hour_usd=prices[d.key], price_source=label)
        if d.key in prices else
        dataclasses.replace(d, price_per_hour_usd=0.0,
                            price_source=f"{name}: not listed by {entry.source}")
        for d in catalog.devices))


PriceChoice = str | Mapping[str, float] | None
"""How prices are chosen: a provider of the shipped book or a prices file (``--prices``), a
``{GPU type: USD}`` override mapping (``GPUPLAN_PRICES_JSON``), or None (the catalog's)."""


def apply_prices(catalog: Catalog, choice: PriceChoice, field: str = "--prices") -> Catalog:
    """`catalog` priced as `choice` says (see `PriceChoice`)."""
    if choice is None:
        return catalog
    if isinstance(choice, Mapping):
        return with_prices(catalog, choice)
    book = shipped_book()
    if choice in book.providers:
        return price_by_provider(catalog, choice, field)
    file = Path(choice)
    if not file.is_file():
        known = ", ".join(sorted(book.providers))
        raise errors.InvalidRequestError(field, f"{choice!r} is neither a provider of the "
                                         f"shipped price book ({known}) nor a prices file")
    document = _read_document(file, field)
    if not is_price_book(document):  # the chart's `prices:` override mapping
        return with_prices(catalog, read_prices_file(file))
    own = parse_price_book(document, str(file))
    if len(own.providers) != 1:
        raise errors.InvalidRequestError(field, f"{file}: a prices file given to {field} holds "
                                         "one provider (a plan compares within one); it has "
                                         f"{', '.join(sorted(own.providers))}")
    name, entry = next(iter(own.providers.items()))
    return priced_by(catalog, name, entry)


def _read_document(file: Path, field: str) -> Any:
    with file.open("rb") as fh:
        data = fh.read(MAX_PRICES_FILE_BYTES + 1)
    if len(data) > MAX_PRICES_FILE_BYTES:
        raise errors.InvalidRequestError(field, f"{file}: larger than {MAX_PRICES_FILE_BYTES} "
                                         "bytes")
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise errors.InvalidRequestError(field, f"{file}: not YAML or JSON: {exc}") from None


def price_by_provider(catalog: Catalog, name: str, field: str) -> Catalog:
    """`catalog` priced by provider `name` of the shipped book (never a file: an HTTP field
    must not name paths on the server); `InvalidRequestError` on `field` lists the known."""
    return priced_by(catalog, name, provider(shipped_book(), name, field))
