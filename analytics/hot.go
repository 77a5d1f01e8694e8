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
	// Gateways maps gateway id to the key's requests there, allowed and
	// denied: its demand, which sizes the shares of a split (see Shares).
	Gateways map[string]int64
	// Denied is how many of the requests were denied. Hotness is judged
	// on the rest, what the key was allowed: a caller cannot make itself
	// hot (and win a split) by sending traffic it is refused.
	Denied int64
	// Recent is the key's allowed requests in the last MinSpan, to the
	// second (zero: not measured).
	Recent int64
	// RecentGateways and RecentDenied are the key's requests per gateway
	// and its denials in the last MinSpan (nil: not measured). They size
	// the split when measured, so shares follow a shift in load within
	// seconds rather than over the whole window.
	RecentGateways map[string]int64
	RecentDenied   int64
}

// demand returns the requests per gateway and the allowed requests that
// size the key's split: the last MinSpan's when measured, over every
// gateway of the window (one quiet since gets the floor).
func (k KeyTraffic) demand() (map[string]int64, int64) {
	if len(k.RecentGateways) == 0 {
		return k.Gateways, k.Allowed()
	}
	d := make(map[string]int64, len(k.Gateways))
	for gw := range k.Gateways {
		d[gw] = 0
	}
	var n int64
	for gw, c := range k.RecentGateways {
		d[gw] = c
		n += c
	}
	return d, n - k.RecentDenied
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
			demand, allowed := k.demand()
			h.Shares = Shares(demand, allowed, cfg.MinGatewayShare)
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

// Shares sizes each gateway's share of a key's capacity from its demand:
// requests maps gateway id to the key's requests there, allowed and denied
// (a saturated gateway's denials are its unmet demand), and allowed is how
// many of them the key's limit admitted, its capacity over the window.
//
// The capacity is filled max-min by demand (water-filling): a gateway that
// asks for less than an equal part keeps all it asks for (and quietHeadroom
// more, so its own jitter is not denied), and what is left
// goes to the busier ones in equal parts, as far as each asks. So a
// gateway at 10/s next to a saturated one keeps its 10/s and the saturated
// one gets the rest, rather than the idle share going unused (an even
// split) or the quiet gateway being starved (a split in proportion to
// requests, which a flood of denials at the busy gateway would swamp).
// When nothing was denied (allowed ≥ requests) every gateway got what it
// asked, and the shares follow the requests.
//
// No share falls under floor (while floor × gateways ≤ 1; otherwise all
// shares are equal), and the shares sum to 1: the gateways apply them to
// the key's whole limit, so an underestimate of the capacity (a split that
// left some of it unused) scales every part up, and the next round's
// allowed count comes closer to the limit.
func Shares(requests map[string]int64, allowed int64, floor float64) map[string]float64 {
	return floored(fill(requests, allowed), floor)
}

// quietHeadroom is how much more than it asked a gateway whose demand is
// met gets: its traffic next round is not exactly this round's, and a
// share cut to the request loses every burst above it. At most this much
// of the quiet gateways' demand goes unused.
const quietHeadroom = 0.1

// fill returns each gateway's part of capacity, filled max-min by demand:
// the smallest demands are met in full (with quietHeadroom) while each fits
// an equal part of what is left; the rest share the remainder equally. A
// capacity of zero or at least the total demand gives each its demand.
func fill(demand map[string]int64, capacity int64) map[string]float64 {
	out := make(map[string]float64, len(demand))
	var total int64
	for gw, n := range demand {
		out[gw] = float64(max(0, n))
		total += max(0, n)
	}
	if capacity <= 0 || capacity >= total {
		return out
	}
	gws := slices.SortedFunc(maps.Keys(demand), func(a, b string) int {
		return cmp.Or(cmp.Compare(out[a], out[b]), cmp.Compare(a, b))
	})
	left := float64(capacity)
	for i, gw := range gws {
		level := left / float64(len(gws)-i)
		want := out[gw] * (1 + quietHeadroom)
		if want > level {
			for _, g := range gws[i:] {
				out[g] = level
			}
			break
		}
		out[gw] = want
		left -= want
	}
	return out
}

// floored turns weights into shares summing to 1, none under floor: the
// gateways whose proportional share falls under it are pinned to it and
// the rest shared by weight, until no more fall under (water-filling).
func floored(weights map[string]float64, floor float64) map[string]float64 {
	out := make(map[string]float64, len(weights))
	var total float64
	for _, w := range weights {
		total += w
	}
	if len(weights) == 0 {
		return out
	}
	if total <= 0 || floor*float64(len(weights)) >= 1 {
		for gw := range weights {
			out[gw] = 1 / float64(len(weights))
		}
		return out
	}
	pinned := make(map[string]bool)
	for {
		free := 1 - floor*float64(len(pinned))
		var rest float64
		for gw, w := range weights {
			if !pinned[gw] {
				rest += w
			}
		}
		changed := false
		for gw, w := range weights {
			if pinned[gw] {
				continue
			}
			if rest <= 0 || free*w/rest < floor {
				pinned[gw] = true
				changed = true
			}
		}
		if !changed {
			for gw, w := range weights {
				if pinned[gw] {
					out[gw] = floor
				} else {
					out[gw] = free * w / rest
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
		shares := map[string]float64{limiter.OtherGateways: othersShare}
		for gw, s := range h.Shares {
			// A gateway that cannot be named (an empty id: its host name
			// unknown) or is named like the others' share checks the
			// others' bucket: its share goes there, added, so the shares
			// still sum to 1 and the directive stays valid (one invalid
			// directive fails the whole set's write).
			if gw == "" {
				gw = limiter.OtherGateways
			}
			shares[gw] += s * (1 - othersShare)
		}
		ds = append(ds, limiter.SplitDirective{
			Key:     limiter.DirectiveKey(h.KeyKind, h.KeyID),
			Shares:  shares,
			Expires: now.Add(ttl),
		})
	}
	return ds
}
