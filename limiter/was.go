package limiter

// A rule with a WasTag is checked in two containers while a fleet moves
// from one layout to the other: its shared one and the one of its own it
// had under WasTag, which gateways of the earlier layout still read and
// write. Both are charged in one decision, all-or-nothing, and the answer
// is the more used of the two, so whichever layout a gateway runs, the
// caller is held to one limit.

func hasWas(rules []Rule) bool {
	for _, r := range rules {
		if r.WasTag != "" {
			return true
		}
	}
	return false
}

// withWas returns rules, then each rule with a WasTag again in its
// previous container (Alone under the WasTag); was[k] is the index in
// rules of the k-th copy. No rule of the result has a WasTag.
func withWas(rules []Rule) (out []Rule, was []int) {
	out = make([]Rule, len(rules), 2*len(rules))
	copy(out, rules)
	for i, r := range rules {
		if r.WasTag == "" {
			continue
		}
		out[i].WasTag = ""
		r.Tag, r.Alone, r.WasTag = r.WasTag, true, ""
		out = append(out, r)
		was = append(was, i)
	}
	return out, was
}

// joinWas folds the decision d of withWas(rules) into one result per
// rule (see both).
func joinWas(d Decision, rules []Rule, was []int) Decision {
	rr := make([]RuleResult, len(rules))
	copy(rr, d.Rules[:len(rules)])
	for i := range rr {
		rr[i].Rule = rules[i]
	}
	for k, i := range was {
		rr[i] = both(rules[i], rr[i], d.Rules[len(rules)+k])
	}
	out := decide(rr)
	out.Time, out.Reason, out.Cached = d.Time, d.Reason, d.Cached
	out.Seq, out.SeqEpoch = d.Seq, d.SeqEpoch
	return out
}

// joinWasStates folds an inspection of withWas(rules) the same way: each
// rule shows the more used of its two states.
func joinWasStates(ks KeyState, rules []Rule, was []int) KeyState {
	states := ks.Rules[:len(rules):len(rules)]
	for k, i := range was {
		if b := ks.Rules[len(rules)+k]; b.Found && (!states[i].Found || b.Remaining < states[i].Remaining) {
			states[i] = b
		}
	}
	ks.Rules = states
	return ks
}

// chunks cuts groups of the n rules (nil: one group of all) into groups
// of at most size rules each.
func chunks(groups [][]int, n, size int) [][]int {
	if groups == nil {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	}
	var out [][]int
	for _, g := range groups {
		for len(g) > size {
			out = append(out, g[:size])
			g = g[size:]
		}
		out = append(out, g)
	}
	return out
}
