SELECT name, type
FROM system.columns
WHERE database = currentDatabase() AND table = 'decisions'
