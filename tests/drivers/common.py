"""What the Python driver scripts share: where to connect, the rows they write, and checks.

The connection comes from the environment: PGWARD_HOST, PGWARD_PORT, PGWARD_USER,
PGWARD_PASSWORD, PGWARD_DB. PGWARD_CLIENTS is how many clients run at once.
"""

import datetime
import decimal
import faulthandler
import os
import sys

HOST = os.environ.get("PGWARD_HOST", "127.0.0.1")
PORT = int(os.environ["PGWARD_PORT"])
USER = os.environ["PGWARD_USER"]
PASSWORD = os.environ.get("PGWARD_PASSWORD", "")
DB = os.environ.get("PGWARD_DB", "app")
CLIENTS = int(os.environ.get("PGWARD_CLIENTS", "5"))
ROUNDS = int(os.environ.get("PGWARD_ROUNDS", "8"))

# A hung driver prints where each of its threads waits, and exits, before the test's own
# time limit kills it without a word.
faulthandler.dump_traceback_later(int(os.environ.get("PGWARD_HANG_AFTER", "90")), exit=True)

INSERT_COLUMNS = "id, name, price, created, data, flag, score, tags, doc"

# The row a client writes for `ident`: one value of each type the table has.
def row(ident):
    return (
        ident,
        f"name {ident} é",
        decimal.Decimal(f"{ident}.25"),
        datetime.datetime(2024, 1, 1 + ident % 28, 12, ident % 60, tzinfo=datetime.timezone.utc),
        bytes([ident % 256, 0, 255, 10]),
        ident % 2 == 0,
        ident / 4,
        [f"t{ident}", None, "x"],
        {"id": ident, "nested": [1, "two"]},
    )


def ident(client, round_no, i):
    """A row id no other client or round uses."""
    return client * 10_000 + round_no * 10 + i


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def fail(err):
    print(f"FAILED: {err!r}", file=sys.stderr)
    sys.exit(1)
