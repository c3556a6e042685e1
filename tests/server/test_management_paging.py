"""The management API's listings sorted, filtered and paged as RabbitMQ's management plugin
does it (rabbit_mgmt_util; issue 30 item 6): the rules on plain lists (paging.listing), then
over real HTTP on a running App with 250 streams, where a page of queues comes back in
RabbitMQ's envelope."""
from __future__ import annotations

import pytest

from riverlog.server.management.paging import PagingError, listing
from test_management import _app, call

pytestmark = pytest.mark.timeout(120)

ITEMS = [{"name": n, "vhost": "/", "messages": m, "detail": {"size": s}}
         for n, m, s in [("b", 3, 30), ("a", 1, 10), ("c-10", 2, 20), ("C-2", 2, None)]]


def names(answer) -> list[str]:
    return [item["name"] for item in (answer["items"] if isinstance(answer, dict) else answer)]


def test_without_page_the_whole_list_is_answered_sorted_when_asked():
    assert names(listing(ITEMS, {})) == ["b", "a", "c-10", "C-2"]  # the listing's own order
    assert names(listing(ITEMS, {"sort": "name"})) == ["C-2", "a", "b", "c-10"]
    assert names(listing(ITEMS, {"sort": "messages"})) == ["a", "C-2", "c-10", "b"]
    assert names(listing(ITEMS, {"sort": "messages", "sort_reverse": "true"})) == [
        "b", "c-10", "C-2", "a"]
    # a dotted path; a null is not a number: after the numbers
    assert names(listing(ITEMS, {"sort": "detail.size"})) == ["a", "c-10", "b", "C-2"]
    assert names(listing(ITEMS, {"sort": "", "sort_reverse": "true"})) == [
        "C-2", "c-10", "a", "b"]
    assert names(listing(ITEMS, {"name": "c"})) == ["b", "a", "c-10", "C-2"]  # needs page


def test_a_page_is_the_envelope_of_the_filtered_sorted_list():
    page = listing(ITEMS, {"page": "1", "page_size": "2"})
    assert page == {"total_count": 4, "item_count": 2, "filtered_count": 4, "page": 1,
                    "page_size": 2, "page_count": 2, "items": [ITEMS[3], ITEMS[1]]}
    assert names(listing(ITEMS, {"page": "2", "page_size": "2"})) == ["b", "c-10"]
    assert listing(ITEMS, {"page": "3", "page_size": "2"})["items"] == []  # right after
    filtered = listing(ITEMS, {"page": "1", "name": "C"})  # case-insensitive substring
    assert names(filtered) == ["C-2", "c-10"] and filtered["filtered_count"] == 2
    assert filtered["page_size"] == 100 and filtered["total_count"] == 4
    regex = listing(ITEMS, {"page": "1", "name": "^c-\\d$", "use_regex": "true"})
    assert names(regex) == ["C-2"]
    assert names(listing(ITEMS, {"page": "1", "name": "^c", "use_regex": "false"})) == []
    empty = listing([], {"page": "1"})
    assert empty["items"] == [] and empty["page_count"] == 0


@pytest.mark.parametrize("query, error", [
    ({"page": "0"}, "invalid_pagination_parameters"),
    ({"page": "1", "page_size": "501"}, "invalid_pagination_parameters"),
    ({"page": "1", "page_size": "0"}, "invalid_pagination_parameters"),
    ({"page": "x"}, "bad_request"),
    ({"page": "4", "page_size": "2"}, "page_out_of_range"),
    ({"page": "1", "name": "(", "use_regex": "true"}, "bad_request"),
])
def test_bad_paging_parameters_are_refused(query, error):
    with pytest.raises(PagingError) as raised:
        listing(ITEMS, query)
    assert raised.value.error == error


@pytest.fixture
async def app(tmp_path):
    app = await _app(tmp_path)
    yield app
    await app.stop()


async def test_queues_come_back_in_pages_over_http(app):
    for i in range(250):
        app.broker.create(f"paged-{i:03d}")
    app.broker.create("other")
    status, page = await call(app, "GET", "/api/queues?page=3&page_size=100&name=paged")
    assert status == 200
    assert (page["total_count"], page["filtered_count"], page["item_count"],
            page["page_count"], page["page"]) == (251, 250, 50, 3, 3)
    assert [q["name"] for q in page["items"]] == [f"paged-{i:03d}" for i in range(200, 250)]
    status, page = await call(app, "GET", "/api/queues/%2F?page=1&page_size=2&sort=name"
                                          "&sort_reverse=true")
    assert [q["name"] for q in page["items"]] == ["paged-249", "paged-248"]
    status, whole = await call(app, "GET", "/api/queues")
    assert status == 200 and isinstance(whole, list) and len(whole) == 251
    status, error = await call(app, "GET", "/api/queues?page=9&page_size=100")
    assert status == 400 and error["error"] == "page_out_of_range"
    status, error = await call(app, "GET", "/api/connections?page=1&page_size=1000")
    assert status == 400 and error["error"] == "invalid_pagination_parameters"
    status, page = await call(app, "GET", "/api/stream/connections?page=1")
    assert status == 200 and page["items"] == [] and page["total_count"] == 0
