package grpcserver

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
		ok   bool
	}{
		{[]string{"Bearer abc"}, "abc", true},
		{[]string{"Basic x", "Bearer abc"}, "abc", true},
		{[]string{"Bearer "}, "", false},
		{[]string{"bearer abc"}, "", false},
		{nil, "", false},
	} {
		md := metadata.MD{}
		if tc.in != nil {
			md["authorization"] = tc.in
		}
		got, ok := BearerToken(metadata.NewIncomingContext(context.Background(), md))
		if got != tc.want || ok != tc.ok {
			t.Errorf("BearerToken(%q) = %q, %v", tc.in, got, ok)
		}
	}
}
