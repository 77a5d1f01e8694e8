package boot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// ErrUsage marks a bad command line or bad input: Main exits 2 with it.
var ErrUsage = errors.New("bad usage")

// Main runs a process's run function with a context that ends on SIGINT or
// SIGTERM, and exits with the error on stderr if it fails: 2 for ErrUsage,
// 1 for any other. It is the whole of every main.
func Main(name string, run func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(ExitCode(err))
	}
}

// ExitCode is the status a process exits with after err: 0 for none, 2
// for ErrUsage, 1 for any other.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	}
	return 1
}

// Actor is one long-running part of a process. Run works until Stop is
// called (or it fails); Stop asks it to end and waits for that, at most
// until its context's deadline. Either may be nil: an actor with only a
// Stop is a step of the shutdown (flush the events).
type Actor struct {
	Name string
	Run  func() error
	Stop func(context.Context) error
}

// Func is an actor that runs fn until Stop cancels fn's context, then
// waits for fn to return.
func Func(name string, fn func(ctx context.Context) error) Actor {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	return Actor{
		Name: name,
		Run: func() error {
			defer close(done)
			return fn(ctx)
		},
		Stop: func(sctx context.Context) error {
			cancel()
			select {
			case <-done:
				return nil
			case <-sctx.Done():
				return fmt.Errorf("%s did not stop in time: %w", name, sctx.Err())
			}
		},
	}
}

// Run is every process's lifecycle: it starts each actor's Run, waits until
// ctx ends (SIGTERM) or any actor returns, then calls the Stops in the
// order given, all within timeout. The order is the shutdown order: stop
// taking work (HTTP), finish and flush what is in flight (events, the
// final insert), then the admin listener, so metrics stay scrapeable to
// the end. Clients (Redis, ClickHouse) close after Run returns, in the
// caller's defers. Run returns the actors' failures and the stops' errors,
// joined.
func Run(ctx context.Context, log *slog.Logger, timeout time.Duration, actors ...Actor) error {
	var g errgroup.Group
	ended := make(chan string, len(actors))
	for _, a := range actors {
		if a.Run == nil {
			continue
		}
		g.Go(func() error {
			err := a.Run()
			ended <- a.Name
			return err
		})
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout_ms", timeout.Milliseconds())
	case name := <-ended:
		log.Warn("shutting down: an actor ended", "actor", name, "timeout_ms", timeout.Milliseconds())
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var errs []error
	for _, a := range actors {
		if a.Stop == nil {
			continue
		}
		if err := a.Stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", a.Name, err))
		}
	}
	// An actor that ignores its Stop must not hold the process past its
	// deadline.
	waited := make(chan error, 1)
	go func() { waited <- g.Wait() }()
	select {
	case err := <-waited:
		errs = append([]error{err}, errs...)
	case <-sctx.Done():
		errs = append(errs, fmt.Errorf("actors still running %v after shutdown began", timeout))
	}
	return errors.Join(errs...)
}
