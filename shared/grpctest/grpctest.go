// Package grpctest runs gRPC servers for tests, on 127.0.0.1.
package grpctest

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Serve runs a gRPC server with what register adds, on a loopback port, until the test ends.
func Serve(t testing.TB, register func(*grpc.Server)) *net.TCPAddr {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return lis.Addr().(*net.TCPAddr)
}

// HealthBackend serves only gRPC health: a backend for a client's channel to connect to, whose
// address tells which one answered.
func HealthBackend(t testing.TB) *net.TCPAddr {
	return Serve(t, func(gs *grpc.Server) { healthpb.RegisterHealthServer(gs, health.NewServer()) })
}
