package serviceid

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type none struct{}

func (none) Current() *workloadcert.Credential { return nil }

func TestBusSecurity(t *testing.T) {
	ingest := spiffe.ID{TrustDomain: "example.org", Namespace: "cp", ServiceAccount: "config-ingest"}
	for _, tc := range []struct {
		name      string
		args      []string
		identity  bool
		wantPeers []string
		wantPlain bool
		err       string
	}{
		{name: "no identity: plaintext, loopback only", args: nil},
		{name: "plaintext asked for", args: []string{"--bus-plaintext"}, identity: true, wantPlain: true},
		{name: "default peers: Sailplane's accounts in the namespace", args: []string{"--trust-domain=example.org", "--namespace=cp"}, identity: true,
			wantPeers: []string{ingest.String(), "spiffe://example.org/ns/cp/sa/endpoint-watcher", "spiffe://example.org/ns/cp/sa/xds-server", "spiffe://example.org/ns/cp/sa/ca", "spiffe://example.org/ns/cp/sa/webhook"}},
		{name: "peers given", args: []string{"--bus-peers=spiffe://td/ns/a/sa/b"}, identity: true, wantPeers: []string{"spiffe://td/ns/a/sa/b"}},
		{name: "bad peer", args: []string{"--bus-peers=spiffe://td/a/b"}, identity: true, err: "--bus-peers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f BusFlags
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			f.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var id workloadcert.Source
			if tc.identity {
				id = none{}
			}
			sec, err := f.Security(id)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sec.AllowPlaintext != tc.wantPlain || (sec.Identity == nil) != (tc.wantPeers == nil) {
				t.Errorf("security %+v: plaintext allowed %v, identity %v; want %v, %v", sec, sec.AllowPlaintext, sec.Identity != nil, tc.wantPlain, tc.wantPeers != nil)
			}
			var peers []string
			for _, p := range sec.Peers {
				peers = append(peers, p.String())
			}
			if !slices.Equal(peers, tc.wantPeers) {
				t.Errorf("peers %v, want %v", peers, tc.wantPeers)
			}
		})
	}
}

func TestIdentityNeedsRootAndCredential(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--ca-address=ca:15012", "--ca-token-file=t"}, "root certificate"},
		{[]string{"--ca-address=ca:15012", "--ca-root-cert=r"}, "token file or a provisioned"},
	} {
		var f Flags
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		f.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Identity(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.err)
		}
	}
	var f Flags
	client, sec, err := f.Identity(slog.New(slog.DiscardHandler))
	if err != nil || client != nil || sec.Identity != nil {
		t.Errorf("no --ca-address: client %v, identity %v, error %v; want none, plaintext", client, sec.Identity, err)
	}
}
