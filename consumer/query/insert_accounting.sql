-- The batch's gateway accounting records (mode accounting), which the raw
-- table leaves out.
INSERT INTO decisions_accounting (time, gateway_id, run_start, decisions, published, dropped_buffer_full,
    dropped_broker_error, dropped_encode_error, dropped_closed, final, batch_id)
SELECT time, gateway_id, acct_run_start, acct_decisions, acct_published, acct_dropped_buffer_full,
    acct_dropped_broker_error, acct_dropped_encode_error, acct_dropped_closed, acct_final, batch_id
FROM {stage}
WHERE mode = 'accounting'
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
