-- key_filters: the analyst's filters on decisions_by_key_1m, spliced by
-- mustSQL wherever a query says {key_filters} (after a WHERE condition).
-- An empty filter matches all; @key matches a key id or a key name.
AND (@rule = '' OR binding_rule = @rule)
AND (@route = '' OR route = @route)
AND (@plan = '' OR plan = @plan)
AND (@gateway = '' OR gateway_id = @gateway)
AND (@key = '' OR key_id = @key OR key_name = @key)
AND (@kind = '' OR key_kind = @kind)
AND (@method = '' OR method = @method)
