-- Admin audit: a gateway admin API's record of a key reset or clear (mode
-- 'admin', event field 22) keeps its action ('reset', 'clear') and actor
-- (the admin token's name, never the token) in the raw table, so the audit
-- trail is readable where every other decision is. Decisions and rows
-- stored before this read as '' (String's default). No rollup counts admin
-- records. The staging table copies the raw table's shape, so it gains the
-- columns too.
ALTER TABLE decisions
    ADD COLUMN admin_action String,
    ADD COLUMN admin_actor String
