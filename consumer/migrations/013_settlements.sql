-- Settlement records (mode 'settlement', event fields 28 and 29): what an
-- admitted request on a route with a token budget reserved, and what its
-- answer said it used. The record's cost is settled - reserved, so a key's
-- costs (its decisions' and its settlements') sum to what it used; the
-- rollups count a settlement's cost but not as a request.
ALTER TABLE decisions
    ADD COLUMN reserved Int64,
    ADD COLUMN settled Int64;
