package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// DoorBucket is where an entry point outside this package (the Envoy
// door) counts one descriptor: the limiter key and the rules of its
// buckets, and how its decision events name it.
type DoorBucket struct {
	Key   string
	Rules []limiter.Rule
	// Identity is the Call.Identity of a request of this descriptor alone.
	Identity string
	// Domain and Descriptor are the event's (Call.Domain, Call.Descriptor).
	Domain     string
	Descriptor []DescriptorEntry
}

// doorBuckets finds a descriptor's buckets (*envoyrls.Service); the error
// says why there are none, in words an operator reads, never naming a
// value.
type doorBuckets interface {
	DoorBucket(domain string, entries []DescriptorEntry) (DoorBucket, error)
}

// SetDoor lets the API reach the buckets of d's descriptors: the
// endpoints take domain=NAME&entry=KEY=VALUE… (the entries of one
// descriptor, in order) instead of a caller. Set it before serving.
func (a *Admin) SetDoor(d doorBuckets) { a.door = d }

// doorView is the body of an admin answer about a descriptor's buckets.
type doorView struct {
	Action    string       `json:"action,omitempty"`
	Kind      string       `json:"kind"` // "envoy"
	Domain    string       `json:"domain"`
	KeyID     string       `json:"key_id"`
	GatewayID string       `json:"gateway_id"`
	Store     string       `json:"store"`
	Buckets   []bucketView `json:"buckets"`
}

// resolveDoor reads a door query: a domain and one descriptor's entries.
func (a *Admin) resolveDoor(r *http.Request) (DoorBucket, *problem) {
	bad := func(status int, typ, detail string) (DoorBucket, *problem) {
		return DoorBucket{}, &problem{Type: typ, Status: status, Detail: detail}
	}
	if a.door == nil {
		return bad(http.StatusNotFound, probAdminNotFound, "This gateway serves no Envoy rate limit API (grpc.listen), so it has no descriptor buckets.")
	}
	q := r.URL.Query()
	for name := range q {
		if name != "domain" && name != "entry" {
			return bad(http.StatusBadRequest, probBadRequest, "Unknown parameter "+strconv.Quote(name)+" beside domain: give domain once and the descriptor's entries as entry=KEY=VALUE, in order.")
		}
	}
	if len(q["domain"]) != 1 || q.Get("domain") == "" || len(q["entry"]) == 0 {
		return bad(http.StatusBadRequest, probBadRequest, "Give domain once and at least one entry=KEY=VALUE (the descriptor's entries, in order).")
	}
	var entries []DescriptorEntry
	for _, e := range q["entry"] {
		k, v, ok := strings.Cut(e, "=")
		if !ok || k == "" {
			return bad(http.StatusBadRequest, probBadRequest, "An entry is KEY=VALUE, its key not empty.")
		}
		entries = append(entries, DescriptorEntry{Key: k, Value: v})
	}
	b, err := a.door.DoorBucket(q.Get("domain"), entries)
	if err != nil {
		return bad(http.StatusNotFound, probAdminNotFound, "No bucket counts this descriptor: "+err.Error()+".")
	}
	return b, nil
}

func (a *Admin) showDoor(w http.ResponseWriter, r *http.Request) {
	b, p := a.resolveDoor(r)
	if p != nil {
		writeProblem(w, *p)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	a.writeDoorView(w, a.doorView(ctx, b, ""))
}

// changeDoor resets or clears a descriptor's buckets, in the shared
// store and this gateway's local fallback memory, and audits it. A
// descriptor's buckets hold only its own state, so both drop it: the
// bucket is full again.
func (a *Admin) changeDoor(w http.ResponseWriter, r *http.Request, actor, action string) {
	b, p := a.resolveDoor(r)
	if p != nil {
		writeProblem(w, *p)
		return
	}
	ka, ok := a.g.store.(keyAdmin)
	if !ok {
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusNotImplemented, Detail: "This gateway's limiter store cannot reset keys."})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	id := identity{key: b.Identity}
	attrs := []any{"action", action, "actor", actor, "remote_addr", r.RemoteAddr, "kind", "envoy",
		"domain", b.Domain, "key_id", a.g.keyID(&id), "rules", ruleNames(b.Rules)}
	err := ka.Reset(ctx, b.Key, b.Rules)
	if local, ok := any(a.g.local).(keyAdmin); ok && a.g.shared {
		_ = local.Reset(ctx, b.Key, b.Rules)
	}
	if err != nil {
		a.log.Error("admin descriptor "+action+" failed", append(attrs, "error", err.Error())...)
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusServiceUnavailable,
			Detail: "The limiter store failed to " + action + " the descriptor's buckets; see the gateway log, and retry."})
		return
	}
	a.log.Info("admin descriptor "+action, attrs...)
	if a.g.pub != nil {
		now := a.g.now()
		store := event.StoreOK
		if !a.g.shared {
			store = event.StoreUnknown
		}
		a.g.pub.Publish(event.Decision{
			ID: event.NewID(now), Time: now, GatewayID: a.g.gatewayID, KeyID: a.g.keyID(&id),
			Route: "envoy:" + b.Domain, Method: http.MethodPost, Plan: b.Domain,
			Allowed: true, StoreStatus: store, Mode: event.ModeAdmin,
			Domain: b.Domain, Descriptor: a.g.eventDescriptor(b.Descriptor),
			Admin: event.AdminAction{Action: action, Actor: actor},
		})
	}
	a.writeDoorView(w, a.doorView(ctx, b, action))
}

func ruleNames(rules []limiter.Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name
	}
	return out
}

// doorView reads the live state of a descriptor's buckets.
func (a *Admin) doorView(ctx context.Context, b DoorBucket, action string) doorView {
	id := identity{key: b.Identity}
	v := doorView{Action: action, Kind: "envoy", Domain: b.Domain, KeyID: a.g.keyID(&id), GatewayID: a.g.gatewayID, Store: "memory"}
	if a.g.shared {
		v.Store = "shared"
	}
	ka, _ := a.g.store.(keyAdmin)
	for _, rule := range b.Rules {
		bv := bucketView{Bucket: rule.Bucket, InForce: true}
		var ks limiter.KeyState
		err := errors.New("the store cannot inspect keys")
		if ka != nil {
			ks, err = ka.Inspect(ctx, b.Key, []limiter.Rule{rule})
		}
		rv := ruleView{Name: rule.Name, Algorithm: string(rule.Algorithm), Limit: rule.Limit,
			WindowSeconds: windowSeconds(rule), Capacity: rule.Capacity(), Shadow: rule.Shadow, Remaining: rule.Capacity()}
		if rv.Algorithm == "" {
			rv.Algorithm = string(limiter.TokenBucket)
		}
		if err != nil {
			bv.Error = err.Error()
		} else if len(ks.Rules) == 1 {
			rs := ks.Rules[0]
			rv.Found, rv.Remaining, rv.Count, rv.Previous = rs.Found, rs.Remaining, rs.Count, rs.Previous
			rv.ResetAfterMS = rs.ResetAfter.Milliseconds()
			bv.TTLMS = ks.TTL.Milliseconds()
		}
		bv.Rules = []ruleView{rv}
		v.Buckets = append(v.Buckets, bv)
	}
	return v
}

func (a *Admin) writeDoorView(w http.ResponseWriter, v doorView) {
	a.writeJSON(w, v)
}
