-- The batch's raw rows, unless the batch was aborted: the check runs in the
-- same statement as the write, so an INSERT that reaches the server after
-- its batch was aborted writes nothing. {columns} is decisionColumns. A
-- gateway's accounting records are not decisions: insert_accounting keeps
-- them.
INSERT INTO decisions ({columns}, batch_id)
SELECT {columns}, batch_id
FROM {stage}
WHERE mode != 'accounting'
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
