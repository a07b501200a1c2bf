"""JSON text a request carries (a manifest, an SLO, a page token), decoded, and refused in the request's terms when
it is not JSON or holds a string no database or protobuf message takes.

JSON's `\\ud800` escape decodes to a lone UTF-16 surrogate: valid JSON, but no UTF-8 encodes it, so storing or
sending it on fails far from the request (SQLite and PostgreSQL drivers, protobuf string fields raise); `\\u0000`
decodes to a NUL, which PostgreSQL text cannot hold. Both are refused here, naming where they are.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from services.errors import InvalidArgument


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone UTF-16 surrogate ({text[e.start]!r}: an escape such as \\ud800 without its pair)"
    return None


def unstorable(value: Any, path: str) -> tuple[str, str] | None:
    """(path, problem) for the first string (an object's key or a value) of a decoded JSON value that holds a
    NUL or a lone surrogate, else None. Paths name keys as `.Key` and list items as `[i]`."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            problem = _bad_text(item)
            if problem:
                return where, f"holds {problem}"
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                problem = _bad_text(key)
                if problem:
                    return where, f"a key holds {problem}"
                stack.append((inner, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{i}]") for i, inner in reversed(list(enumerate(item))))
    return None


def loads(text: str | bytes, field: str) -> Any:
    """`text` decoded; INVALID_ARGUMENT on `field` when it is not JSON, nests too deeply, or holds a string
    `unstorable` refuses (the violation names the string's own path)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidArgument.of(field, "not valid JSON: nested too deeply") from None
    except ValueError as e:     # UnicodeDecodeError (bytes that are not UTF-8) included
        if "integer string conversion" in str(e):     # Python's own limit, whose advice is for Python code
            raise InvalidArgument.of(field, f"holds an integer of more than {sys.get_int_max_str_digits()} digits; "
                                            "no field takes one") from None
        raise InvalidArgument.of(field, f"not valid JSON: {e}") from None
    return require_storable(data, field)


def require_storable(value: Any, field: str) -> Any:
    """`value`, or INVALID_ARGUMENT on the path of its first string `unstorable` refuses."""
    problem = unstorable(value, field)
    if problem:
        where, what = problem
        raise InvalidArgument.of(where, f"{what}; no service can store it: remove it")
    return value
