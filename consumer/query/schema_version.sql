-- The newest migration applied to this database (0: none yet).
SELECT toUInt32(max(version)) FROM schema_migrations
