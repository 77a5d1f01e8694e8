INSERT INTO schema_migrations (version, name, applied_at)
