-- Ends any statement of the batch still running (its query ids start with
-- the batch's prefix), so none writes after the batch's rows are deleted.
KILL QUERY WHERE query_id LIKE ? SYNC
