SELECT DISTINCT partition
FROM system.parts
WHERE database = currentDatabase() AND table = ? AND active
