SELECT DISTINCT version FROM schema_migrations
