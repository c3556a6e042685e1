# Sorting, filtering and paging of the management API's listings, as RabbitMQ's management
# plugin does them (rabbit_mgmt_util: pagination_params, sort_list, filter_and_paginate,
# range_filter). Owns the query parameters `sort`, `sort_reverse`, `page`, `page_size`,
# `name` and `use_regex` and the paged envelope. Pure: a list of JSON objects in, a list or
# an envelope out; no aiohttp, no server state.
# Rules (RabbitMQ's): without `page` the answer is the whole list, sorted (by `sort`, a
# dotted field path, then the listing's default fields `vhost`, `name`; `sort=` empty: not
# sorted; riverlog's own order when neither `sort` nor `page` is given), `name` ignored; with `page` (>= 1) and `page_size` (1..500, default 100) it is the
# envelope {total_count, item_count, filtered_count, page, page_size, page_count, items},
# the items first filtered by `name` (a case-insensitive substring, or with
# `use_regex=true` a case-insensitive regular expression); a page past the last one (but
# the one right after it) is an error, as is a bad number or expression. A regular
# expression runs under a time budget (`regex`'s timeout), so no request can stall the loop.
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import regex

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
REGEX_MAX_CHARS = 1000  # a longer `name` expression is refused (it runs on every item)
REGEX_BUDGET_S = 0.2  # s: what one listing's `name` expression may take over all items


class PagingError(ValueError):
    """A listing request RabbitMQ answers 400: ``error`` is its error word
    (``invalid_pagination_parameters``, ``page_out_of_range``, ``bad_request``)."""

    def __init__(self, error: str, reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason


def _number(query: Mapping[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise PagingError("bad_request", f"{key} {value!r} is not an integer") from None


def _field(item: Any, path: Sequence[str]) -> Any:
    """The value at a dotted path (missing: 0 at the last step, as RabbitMQ puts "nothing"
    before everything else)."""
    for i, key in enumerate(path):
        default = 0 if i == len(path) - 1 else {}
        item = item.get(key, default) if isinstance(item, dict) else default
    return item


def _sort_key(value: Any) -> tuple:
    """An order over JSON values of any type, numbers before strings before the rest (as
    Erlang orders numbers before binaries); None and booleans count as strings."""
    if isinstance(value, bool) or value is None:
        return (1, str(value).lower())
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, repr(value))


def sort_items(items: list[dict], query: Mapping[str, str],
               default: Sequence[str] = ("vhost", "name")) -> list[dict]:
    """``items`` sorted as RabbitMQ sorts a listing: by ``query["sort"]`` (a dotted path)
    then the ``default`` fields; ``sort=`` empty leaves them as they are; ``sort_reverse``
    ``true`` reverses."""
    sort = query.get("sort")
    fields = [] if sort == "" else ([sort] if sort else []) + [f for f in default if f != sort]
    if fields:
        paths = [f.split(".") for f in fields]
        ordered = sorted(items, key=lambda item: [_sort_key(_field(item, p)) for p in paths])
    else:  # nothing to sort by: the listing's own order
        ordered = list(items)
    if query.get("sort_reverse") == "true":
        ordered.reverse()
    return ordered


def _matcher(name: str, use_regex: bool):
    if not use_regex:
        lowered = name.lower()
        return lambda value: lowered in value.lower()
    if len(name) > REGEX_MAX_CHARS:
        raise PagingError("bad_request", f"name: a regular expression of at most "
                                         f"{REGEX_MAX_CHARS} characters")
    try:
        pattern = regex.compile(name, regex.IGNORECASE)
    except regex.error as exc:
        raise PagingError("bad_request", f"name {name!r} is not a regular expression: {exc}"
                          ) from None
    deadline = time.monotonic() + REGEX_BUDGET_S

    def matches(value: str) -> bool:
        try:
            return pattern.search(value, timeout=max(deadline - time.monotonic(), 0.001)) \
                is not None
        except TimeoutError:
            raise PagingError("bad_request", f"name {name!r}: the regular expression took "
                                             f"over {REGEX_BUDGET_S} s") from None
    return matches


def listing(items: list[dict], query: Mapping[str, str],
            default: Sequence[str] = ("vhost", "name")) -> list[dict] | dict[str, Any]:
    """What a listing endpoint answers for ``query`` (the request's query parameters):
    the sorted list, or with ``page`` the paged envelope. Raises ``PagingError`` for a page
    or page size that is not a positive integer (page_size at most 500), a page out of
    range, or a ``name`` that is not a valid regular expression with ``use_regex``."""
    page, page_size = _number(query, "page"), _number(query, "page_size")
    if page is None and "sort" not in query:
        default = ()  # the listing's own order (e.g. connections oldest first), as before
    ordered = sort_items(items, query, default)
    if page is None:
        return ordered
    if page_size is None:
        page_size = DEFAULT_PAGE_SIZE
    if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise PagingError("invalid_pagination_parameters",
                          f"Invalid pagination parameters: page number {page}, "
                          f"page size {page_size}")
    name = query.get("name")
    filtered = ordered
    if name:
        matches = _matcher(name, query.get("use_regex") == "true")
        filtered = [item for item in ordered
                    if isinstance(item.get("name"), str) and matches(item["name"])]
    start = (page - 1) * page_size
    if start > len(filtered):
        raise PagingError("page_out_of_range",
                          f"Page out of range, page: {page} page size: {page_size}, "
                          f"len: {len(filtered)}")
    shown = filtered[start:start + page_size]
    return {"total_count": len(items), "item_count": len(shown),
            "filtered_count": len(filtered), "page": page, "page_size": page_size,
            "page_count": (len(filtered) + page_size - 1) // page_size, "items": shown}
