SELECT count()
FROM system.mutations
WHERE database = currentDatabase() AND table = ? AND is_done = 0
