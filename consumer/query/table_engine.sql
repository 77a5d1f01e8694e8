SELECT engine_full
FROM system.tables
WHERE database = currentDatabase() AND name = ?
