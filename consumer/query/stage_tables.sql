-- The staging tables in the connection's database, and maybe a few more
-- ('_' matches any character): the caller keeps those of its own group.
SELECT name FROM system.tables WHERE database = currentDatabase() AND name LIKE 'decisions_stage_%'
