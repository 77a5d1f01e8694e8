package analytics

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// KeyTraffic is one key's requests over a window, per gateway, as the
// hot-key query returns it.
type KeyTraffic struct {
	KeyID   string
	KeyKind string
	// KeyName is the key's name (an API key's configured id), or "".
	KeyName string
	// Gateways maps gateway id to the key's requests there: its demand,
	// which sizes the shares of a split.
	Gateways map[string]int64
	// Denied is how many of the requests were denied. Hotness is judged
	// on the rest, what the key was allowed: a caller cannot make itself
	// hot (and win a split) by sending traffic it is refused.
	Denied int64
	// Recent is the key's allowed requests in the last MinSpan, to the
	// second (zero: not measured).
	Recent int64
}

// Allowed is the key's allowed requests at all gateways.
func (k KeyTraffic) Allowed() int64 { return k.Requests() - k.Denied }

// Requests is the key's requests at all gateways.
func (k KeyTraffic) Requests() int64 {
	var n int64
	for _, c := range k.Gateways {
		n += c
	}
	return n
}

// HotKey is a key the detector found hot, with its evidence.
type HotKey struct {
	KeyID   string `json:"key_id"`
	KeyKind string `json:"key_kind"`
	// KeyName is the key's name (an API key's configured id), or "".
	KeyName string `json:"key_name,omitempty"`
	// Requests is the key's allowed requests over the window.
	Requests int64 `json:"requests"`
	// Rate is allowed requests per second over the window.
	Rate float64 `json:"rate"`
	// Share is the key's share of all requests over the window.
	Share float64 `json:"share"`
	// Reason is what made it hot: "rate", "share", or "cooling" (split
	// already and not yet cool enough to lift).
	Reason string `json:"reason"`
	// Gateways maps gateway id to the key's requests there.
	Gateways map[string]int64 `json:"gateways"`
	// Shares is each gateway's share of the key's capacity; nil when the
	// key is not split (too few gateways).
	Shares map[string]float64 `json:"shares,omitempty"`
	// Since is when the detector first found the key hot in this run of
	// analytics (set by Detector).
	Since time.Time `json:"since,omitzero"`
}

// Threshold is the least requests a key needs over a window of span (with
// total requests in all) to be hot, given cfg: the smaller of the rate test
// and the share test. Queries use it to skip the long tail.
func (h HotConfig) Threshold(total int64, span time.Duration) int64 {
	sec := span.Seconds()
	t := h.MinRate * sec
	if h.MinShare > 0 {
		t = min(t, max(h.ShareMinRate*sec, h.MinShare*float64(total)))
	}
	return max(1, int64(t*min(1, h.CoolRatio)))
}

// DetectHotKeys returns the hot keys among keys, hottest first. total is
// all requests in the window and span its length, the rate's denominator.
// A key's rate is the larger of its rate over the window and its rate over
// the last MinSpan (KeyTraffic.Recent), so a key that turns hot is found in
// seconds rather than once it has filled the window. split names the keys
// whose split is in force now: they stay hot until they fall under
// CoolRatio × the threshold.
func DetectHotKeys(cfg HotConfig, keys []KeyTraffic, total int64, span time.Duration, split map[string]bool) []HotKey {
	if cfg.Disabled || span <= 0 {
		return nil
	}
	var hot []HotKey
	for _, k := range keys {
		n := k.Allowed()
		if n <= 0 {
			continue
		}
		rate := float64(n) / span.Seconds()
		if cfg.MinSpan > 0 {
			rate = max(rate, float64(k.Recent)/cfg.MinSpan.Seconds())
		}
		h := HotKey{KeyID: k.KeyID, KeyKind: k.KeyKind, KeyName: k.KeyName, Requests: n, Rate: rate, Gateways: k.Gateways, Share: ratio(n, total)}
		byShare := cfg.MinShare > 0 && h.Rate >= cfg.ShareMinRate
		switch {
		case h.Rate >= cfg.MinRate:
			h.Reason = "rate"
		case byShare && h.Share >= cfg.MinShare:
			h.Reason = "share"
		case split[limiter.DirectiveKey(k.KeyKind, k.KeyID)] &&
			(h.Rate >= cfg.CoolRatio*cfg.MinRate ||
				cfg.MinShare > 0 && h.Rate >= cfg.CoolRatio*cfg.ShareMinRate && h.Share >= cfg.CoolRatio*cfg.MinShare):
			h.Reason = "cooling"
		default:
			continue
		}
		if len(k.Gateways) >= cfg.MinGateways {
			h.Shares = Shares(k.Gateways, cfg.MinGatewayShare)
		}
		hot = append(hot, h)
	}
	slices.SortFunc(hot, func(a, b HotKey) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.KeyID, b.KeyID))
	})
	if len(hot) > cfg.MaxKeys {
		hot = hot[:cfg.MaxKeys]
	}
	return hot
}

// Shares sizes each gateway's share of a key's capacity from its observed
// share of the key's requests, so a gateway that gets three times the
// traffic gets three times the capacity. No share falls under floor (while
// floor × gateways ≤ 1; otherwise all shares are equal); the rest is split
// in proportion to the requests, and the shares sum to 1.
func Shares(requests map[string]int64, floor float64) map[string]float64 {
	out := make(map[string]float64, len(requests))
	var total int64
	for _, n := range requests {
		total += max(0, n)
	}
	if len(requests) == 0 {
		return out
	}
	if total == 0 || floor*float64(len(requests)) >= 1 {
		for gw := range requests {
			out[gw] = 1 / float64(len(requests))
		}
		return out
	}
	// Water-filling: pin the gateways whose proportional share falls under
	// the floor, then share what is left among the others by requests,
	// until no more fall under.
	pinned := make(map[string]bool)
	for {
		free := 1 - floor*float64(len(pinned))
		var rest int64
		for gw, n := range requests {
			if !pinned[gw] {
				rest += max(0, n)
			}
		}
		changed := false
		for gw, n := range requests {
			if pinned[gw] {
				continue
			}
			s := free * float64(max(0, n)) / float64(rest)
			if rest == 0 || s < floor {
				pinned[gw] = true
				changed = true
			}
		}
		if !changed {
			for _, gw := range slices.Sorted(maps.Keys(requests)) {
				if pinned[gw] {
					out[gw] = floor
				} else {
					out[gw] = free * float64(requests[gw]) / float64(rest)
				}
			}
			return out
		}
	}
}

// othersShare is the part of a split key's limit reserved for gateways the
// split does not name (limiter.OtherGateways): one that joins the fleet
// after analytics looked checks that small bucket, so the split still hands
// out exactly the limit, until the next round names it.
const othersShare = 0.02

// SplitDirectives turns hot keys into split directives expiring ttl after
// now. Keys without shares (seen at too few gateways) get none.
func SplitDirectives(hot []HotKey, now time.Time, ttl time.Duration) []limiter.SplitDirective {
	var ds []limiter.SplitDirective
	for _, h := range hot {
		if len(h.Shares) == 0 {
			continue
		}
		shares := make(map[string]float64, len(h.Shares)+1)
		for gw, s := range h.Shares {
			shares[gw] = s * (1 - othersShare)
		}
		shares[limiter.OtherGateways] = othersShare
		ds = append(ds, limiter.SplitDirective{
			Key:     limiter.DirectiveKey(h.KeyKind, h.KeyID),
			Shares:  shares,
			Expires: now.Add(ttl),
		})
	}
	return ds
}
