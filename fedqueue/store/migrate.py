"""Schema branches and their upgrades.

The schema is the core's branch (runs, task timings, utilization samples) beside one branch per job kind (its
own tables). Each branch is a line of Alembic revisions in a folder of its own and records where it stands in a
version table of its own, so a kind's revisions never wait on another kind's, and a kind that is not installed
where the database is opened is simply not looked at. The core goes first: kinds' tables refer to `runs`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from fedqueue.errors import ConfigError, ServiceUnavailable

if TYPE_CHECKING:  # alembic itself is imported only when a schema is checked or upgraded
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).with_name("migrations")
CORE = "core"
# fedqueue's revisions before the kinds had branches: one line (0001-0011) that made every table. A database
# still there is brought to its end, which is the branches' first revisions, and carries on from them.
LEGACY = MIGRATIONS / "legacy"
UPGRADE_HINT = "`fedqueue submit`, `fedqueue run` or `fedqueue worker` upgrade it"
# Postgres advisory lock held by the migrating transaction ("fedqueue" in ASCII, a positive bigint).
MIGRATION_LOCK_KEY = 0x6665647175657565
_BRANCH_NAME = re.compile(r"[a-z][a-z0-9_]{0,30}")


@dataclass(frozen=True)
class SchemaBranch:
    """One line of schema revisions: the core's, or a job kind's own tables."""

    name: str
    revisions: Path  # the folder of its Alembic revision scripts

    def __post_init__(self) -> None:
        if not _BRANCH_NAME.fullmatch(self.name):
            raise ConfigError(f"schema branch {self.name!r}: expected lowercase letters, digits and _")
        if not self.revisions.is_dir():
            raise ConfigError(f"schema branch {self.name!r}: no folder of revisions at {self.revisions}")

    @property
    def version_table(self) -> str:
        # The core keeps Alembic's default table, where the earlier single line of revisions recorded itself.
        return "alembic_version" if self.name == CORE else f"alembic_version_{self.name}"

    @property
    def tables_named(self) -> str:
        return "fedqueue tables" if self.name == CORE else f"tables of the {self.name} job kind"


CORE_BRANCH = SchemaBranch(CORE, MIGRATIONS / "versions")


def branches_with_core(kinds: Sequence[SchemaBranch]) -> list[SchemaBranch]:
    """The core's branch first, then the kinds' in name order; a kind may not take the core's name."""
    if any(branch.name == CORE for branch in kinds):
        raise ConfigError(f"schema branch {CORE!r} is the core's: a job kind's branch needs another name")
    return [CORE_BRANCH, *sorted(kinds, key=lambda branch: branch.name)]


def _config(revisions: Path) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_locations", str(revisions))
    return config


@functools.cache
def _scripts(revisions: Path) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(revisions))


def head_revision(branch: SchemaBranch = CORE_BRANCH) -> str:
    """The newest revision of a branch: the schema this code reads and writes."""
    head = _scripts(branch.revisions).get_current_head()
    assert head is not None, f"schema branch {branch.name} has no head revision"
    return head


def known_revisions(revisions: Path) -> set[str]:
    return {script.revision for script in _scripts(revisions).walk_revisions()}


def schema_revision(bind: Engine | Connection, branch: SchemaBranch = CORE_BRANCH) -> str | None:
    """The revision a branch's tables are at, or None when the database has none of them. Reads only."""
    from alembic.runtime.migration import MigrationContext

    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return schema_revision(connection, branch)
    return MigrationContext.configure(bind, opts={"version_table": branch.version_table}).get_current_revision()


def schema_problem(shown: str, branch: SchemaBranch, revision: str | None) -> str | None:
    """One line saying why this code cannot use a branch at `revision`; None when it is at its head."""
    head = head_revision(branch)
    if revision == head:
        return None
    if revision is None:
        if branch.name == CORE:
            return f"database {shown} has no fedqueue tables (submit a run first, or start `fedqueue worker`)"
        return f"database {shown} has no {branch.tables_named} yet ({UPGRADE_HINT})"
    known = known_revisions(branch.revisions)
    if branch.name == CORE:
        known |= known_revisions(LEGACY)
    if revision not in known:
        return (
            f"database {shown}: {branch.tables_named}: schema revision {revision} is newer than this fedqueue's "
            f"{head}; upgrade fedqueue"
        )
    return f"database {shown}: {branch.tables_named}: schema is at revision {revision} but this fedqueue needs {head} ({UPGRADE_HINT})"


def require_current_schema(engine: Engine, branches: Sequence[SchemaBranch], shown: str) -> None:
    """Refuse, in one line, a database whose core or installed kinds' tables this code cannot use."""
    with engine.connect() as connection:
        for branch in branches:
            problem = schema_problem(shown, branch, schema_revision(connection, branch))
            if problem is not None:
                raise ServiceUnavailable(problem)


def _upgrade_branch(connection: Connection, revisions: Path, version_table: str) -> None:
    from alembic import command

    config = _config(revisions)
    config.attributes["connection"] = connection
    config.attributes["version_table"] = version_table
    command.upgrade(config, "head")


def _leave_legacy_line(connection: Connection) -> None:
    """A database on the earlier single line: bring it to that line's end, where the core's first revision
    (and each kind's first, which finds its tables in place) stands."""
    revision = schema_revision(connection, CORE_BRANCH)
    if revision is None or revision not in known_revisions(LEGACY):
        return
    _upgrade_branch(connection, LEGACY, CORE_BRANCH.version_table)
    [first] = _scripts(CORE_BRANCH.revisions).get_bases()  # its tables are what the legacy line ends with
    connection.execute(text(f"UPDATE {CORE_BRANCH.version_table} SET version_num = :now"), {"now": first})


def upgrade_in_transaction(connection: Connection, branches: Sequence[SchemaBranch], shown: str) -> None:
    """Bring every branch to its newest revision inside the caller's transaction, one migrator at a time."""
    if connection.dialect.name == "postgresql":
        # Concurrent migrators queue here; each next one finds the schema current.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    _leave_legacy_line(connection)
    for branch in branches:
        revision = schema_revision(connection, branch)
        if revision is not None and revision not in known_revisions(branch.revisions):
            raise ServiceUnavailable(schema_problem(shown, branch, revision) or "")
        _upgrade_branch(connection, branch.revisions, branch.version_table)
