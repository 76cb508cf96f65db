"""Storage: the schema, engines for Postgres and SQLite, and migrations."""
