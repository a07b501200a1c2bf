"""Keyset paging for the List* calls: `page_size` (0: 100, at most 1000) and an opaque `next_page_token`.

Keyset, not offset: a row made or removed between two pages neither repeats nor skips another. The token is
the last row's sort key, base64url of its JSON (floats round-trip exactly), so it means nothing to a client
and a token that is not one of ours is INVALID_ARGUMENT, not a silently odd page.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from services import json_text
from services.errors import InvalidArgument

PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument.of("page_size", f"must be >= 0 (0: {PAGE_SIZE}; at most {MAX_PAGE_SIZE})")
    return min(requested or PAGE_SIZE, MAX_PAGE_SIZE)


def _fits(value: Any, column: InstrumentedAttribute) -> bool:
    """Whether a token's key value has its column's type (PostgreSQL refuses to compare text with numbers)."""
    if column.type.python_type is str:
        # A string our tokens never hold (a NUL, a lone surrogate) fails in the database driver, not as a token.
        return isinstance(value, str) and json_text.unstorable(value, "") is None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if column.type.python_type is int:
        # Our tokens hold a row's integer as it was; a float, or one no 64-bit column holds (the driver raises
        # OverflowError), is not one of them.
        return isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX
    try:
        return math.isfinite(float(value))
    except OverflowError:           # an integer too large for a float
        return False


def _position(token: str, order: Sequence[InstrumentedAttribute]) -> list[Any] | None:
    if not token:
        return None
    try:
        key = json.loads(base64.b64decode(token, altchars=b"-_", validate=True))
        if not (isinstance(key, list) and len(key) == len(order) and all(map(_fits, key, order))):
            raise ValueError(token)
    except (ValueError, TypeError, binascii.Error, RecursionError):
        raise InvalidArgument.of("page_token", "not a token from a previous response (leave it empty for the "
                                               "first page)") from None
    return key


def page(session: Session, query: Select, order: Sequence[InstrumentedAttribute], requested_size: int,
         token: str) -> tuple[list[Any], str]:
    """One page of `query`'s rows in `order` (ascending columns, unique together) after `token`'s position,
    and the token of the next page ("" after the last)."""
    size = page_size(requested_size)
    after = _position(token, order)
    if after is not None:
        query = query.where(tuple_(*order) > tuple_(*after))
    rows = list(session.scalars(query.order_by(*order).limit(size + 1)))
    if len(rows) <= size:
        return rows, ""
    rows = rows[:size]
    return rows, token_after(rows[-1], order)


def token_after(row: Any, order: Sequence[InstrumentedAttribute]) -> str:
    """The token of the page that starts after `row` (for a caller that ends a page early, e.g. at a byte
    budget)."""
    return base64.urlsafe_b64encode(json.dumps([getattr(row, c.key) for c in order]).encode()).decode()
