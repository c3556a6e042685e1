# The Iceberg catalog URI as riverlog shows it to clients (the Open answer's
# riverlog_table_catalog) and in errors: its secrets hidden (riverlog.tables.iceberg.redacted).
from __future__ import annotations

import pytest

from riverlog.tables.iceberg import redacted


@pytest.mark.parametrize("uri, shown", [
    ("postgresql+psycopg2://riverlog:hunter2@db:5432/tables",
     "postgresql+psycopg2://riverlog:***@db:5432/tables"),
    ("postgresql+psycopg2://riverlog@db/tables?password=hunter2&sslmode=require",
     "postgresql+psycopg2://riverlog@db/tables?password=***&sslmode=require"),
    ("https://rest.example/catalog?token=abc&warehouse=w&s3.secret-access-key=k",
     "https://rest.example/catalog?token=***&warehouse=w&s3.secret-access-key=***"),
    ("sqlite:////data/tables/catalog.db", "sqlite:////data/tables/catalog.db"),
])
def test_a_catalog_uri_told_to_clients_hides_its_secrets(uri, shown):
    # the Open answer names the catalog to every client (riverlog_table_catalog): a password
    # in the query string or a REST catalog's token went out as given (review finding)
    assert redacted(uri) == shown
