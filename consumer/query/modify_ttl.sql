ALTER TABLE {table} MODIFY TTL {column} + toIntervalDay(?)
