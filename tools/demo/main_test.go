package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHeaderPairs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
		err   string
	}{
		{"none", nil, nil, ""},
		{"pairs, keys lower-cased as gRPC wants", []string{"X-Canary=true", "a=b=c"}, []string{"x-canary", "true", "a", "b=c"}, ""},
		{"empty value", []string{"x-empty="}, []string{"x-empty", ""}, ""},
		{"no =", []string{"x-canary"}, nil, `--header "x-canary": want key=value`},
		{"no key", []string{"=v"}, nil, `--header "=v": want key=value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := headerPairs(tc.flags)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestNeedsBootstrap: without GRPC_XDS_BOOTSTRAP both commands say what to do instead of
// failing inside gRPC.
func TestNeedsBootstrap(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	for _, args := range [][]string{{"server"}, {"client", "xds:///echo.demo.svc.cluster.local:7070"}} {
		cmd := newCommand()
		cmd.SetArgs(args)
		cmd.SetOut(&strings.Builder{})
		cmd.SetErr(&strings.Builder{})
		if err := cmd.Execute(); !errors.Is(err, errNoBootstrap) {
			t.Errorf("%v: got %v, want %v", args, err, errNoBootstrap)
		}
	}
}
