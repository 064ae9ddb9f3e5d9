"""The registry's persistence: the database schema with its migrations, and the store.

May import: ``platform.api``; SQLAlchemy."""
