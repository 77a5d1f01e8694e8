-- How many partitions one INSERT may write before current ClickHouse refuses
-- it whole (TOO_MANY_PARTS); no row on servers without the setting (18.16),
-- 0 for no limit.
SELECT value
FROM system.settings
WHERE name = 'max_partitions_per_insert_block'
