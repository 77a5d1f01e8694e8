-- Directives in force (event fields 26 and 27): the NAT factor a gateway
-- applied to a decision's rules (0: none), and the shares of the split it
-- applied, by gateway ("*": those the split does not name; empty: none).
-- What-if replays read them to decide each decision under the rules the
-- gateway really checked.
ALTER TABLE decisions
    ADD COLUMN nat_factor Float64,
    ADD COLUMN split_gateways Array(String),
    ADD COLUMN split_shares Array(Float64);
