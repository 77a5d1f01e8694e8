package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Admin is a process's operator endpoints: /metrics, /healthz (alive),
// /readyz (Ready returns nil) and, with Pprof, /debug/pprof/.
type Admin struct {
	Registry *prometheus.Registry
	// Ready reports why the process should not get work yet; nil is
	// always ready.
	Ready func(context.Context) error
	// Pprof serves the profiler. Off by default: a profile costs CPU and
	// shows internals.
	Pprof bool
}

// Register adds the endpoints to mux, which may serve more (analytics
// serves its API beside them).
func (a Admin) Register(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{Registry: a.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if a.Ready != nil {
			if err := a.Ready(r.Context()); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	if a.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
}

// Handler is a mux with only the admin endpoints.
func (a Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	a.Register(mux)
	return mux
}

// NewServer returns an HTTP server for h with the timeouts every process's
// operator and API listeners use, its own errors logged at warn.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// Long enough for a 30s CPU profile and a year of minutes from
		// analytics.
		WriteTimeout: 60 * time.Second,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Listen opens addr for srv and returns the actor that serves on it until
// stopped; Stop shuts srv down gracefully (in-flight requests finish
// within the stop's deadline). Close the listener if the actor never runs.
func Listen(name, addr string, srv *http.Server) (Actor, net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return Actor{}, nil, fmt.Errorf("listen %s %s: %w", name, addr, err)
	}
	return Actor{
		Name: name,
		Run: func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s %s: %w", name, ln.Addr(), err)
			}
			return nil
		},
		Stop: srv.Shutdown,
	}, ln, nil
}
