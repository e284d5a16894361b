package bustest

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"sailplane.dev/shared/bus"
)

// Serve serves s over gRPC (bus.ServeGRPC) on 127.0.0.1 until the test ends and returns its
// address.
func Serve(t testing.TB, s *bus.Store, log *slog.Logger, sec bus.Security, extra ...bus.Registrar) string {
	t.Helper()
	srv, err := bus.ServeGRPC(s, "127.0.0.1:0", log, sec, extra...)
	if err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	srv.Listening = func(a net.Addr) { addrc <- a.String() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bus server: %v", err)
		}
	})
	return <-addrc
}
