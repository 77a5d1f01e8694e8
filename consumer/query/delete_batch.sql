ALTER TABLE {table} DELETE WHERE batch_id = ?
