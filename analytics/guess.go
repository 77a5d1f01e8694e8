package analytics

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// Token guessing: each client may present a wrong token (a bearer token
// or the sign-in form's) MaxGuesses times per GuessWindow; past that, its
// every token is refused with 429 until the window ends, before it is
// compared, so a guesser learns nothing more from the answers. The client
// is the connection's address (an IPv6 /64, as the gateway keys them),
// never a forwarding header, which the guesser would write; behind a proxy
// every client shares its budget, so a guesser there holds up the proxy's
// token users for a window, not longer. Sessions are not counted: their
// ids are 256 random bits, and a browser's stale cookie is no guess.
const (
	MaxGuesses  = 10
	GuessWindow = time.Minute
	// maxGuessers bounds the clients tracked; when full, those whose
	// window ended go first, then the one whose window ends soonest.
	maxGuessers = 10000
)

const probTooManyGuesses = "urn:edgelimit:problem:too-many-wrong-tokens"

// guesses counts each client's wrong tokens in its current window.
type guesses struct {
	mu sync.Mutex
	by map[string]guessWindow
}

type guessWindow struct {
	ends  time.Time
	wrong int
}

// clientOf is r's client for the guess budget.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if k, ok := limiter.IPKey(host); ok {
		return k
	}
	return host
}

// blocked reports whether client has used up its wrong tokens at now, and
// until when.
func (g *guesses) blocked(client string, now time.Time) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w, ok := g.by[client]
	if !ok || !now.Before(w.ends) {
		return time.Time{}, false
	}
	return w.ends, w.wrong >= MaxGuesses
}

// wrong counts a wrong token from client at now.
func (g *guesses) wrong(client string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.by == nil {
		g.by = map[string]guessWindow{}
	}
	w, ok := g.by[client]
	if !ok || !now.Before(w.ends) {
		if !ok && len(g.by) >= maxGuessers {
			g.evict(now)
		}
		w = guessWindow{ends: now.Add(GuessWindow)}
	}
	w.wrong++
	g.by[client] = w
}

// evict drops the windows that ended, or else the one ending soonest.
func (g *guesses) evict(now time.Time) {
	soonest, at := "", time.Time{}
	for c, w := range g.by {
		if !now.Before(w.ends) {
			delete(g.by, c)
		} else if soonest == "" || w.ends.Before(at) {
			soonest, at = c, w.ends
		}
	}
	if len(g.by) >= maxGuessers {
		delete(g.by, soonest)
	}
}

// tooManyGuesses answers a client over its budget: 429 until its window
// ends.
func tooManyGuesses(w http.ResponseWriter, until, now time.Time) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(until.Sub(now).Round(time.Second)/time.Second))))
	writeProblem(w, problem{Type: probTooManyGuesses, Status: http.StatusTooManyRequests,
		Detail: "Too many wrong tokens from this address; wait for Retry-After seconds."})
}
