-- The decision's time to the microsecond (the store's clock, as the event
-- carries it): time_us is the microseconds within time_ms. What-if replays
-- decide each decision at the moment the store did.
ALTER TABLE decisions
    ADD COLUMN time_us UInt16;
