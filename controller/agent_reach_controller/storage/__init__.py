"""Storage: every SQL statement, the schema, engines for Postgres and SQLite, and migrations."""
