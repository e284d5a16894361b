package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/version"
)

// serverVersion is one server's row in `sailplanectl version`.
type serverVersion struct {
	// Role is what the address was given as: xds, bus or ca.
	Role      string `json:"role"`
	Address   string `json:"address"`
	Component string `json:"component,omitempty"`
	Version   string `json:"version,omitempty"`
	// Reachable: the server answered (Error then says why it told no version).
	Reachable bool `json:"reachable"`
	// Error says why the server did not tell its version: unreachable, or not Sailplane.
	Error string `json:"error,omitempty"`
	// Unverified: reached over TLS without checking the server's certificate (no --root-cert).
	Unverified bool `json:"unverified,omitempty"`
}

func versionCmd() *cobra.Command {
	var (
		xds, buses, cas []string
		rootCert        string
		serverName      string
		security        busFlags
		timeout         time.Duration
		clientOnly      bool
		format          *string
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print sailplanectl's version and that of every server it reaches",
		Long: `Print sailplanectl's version and the version of each Sailplane server it reaches. Every Sailplane
gRPC server (xDS, bus, ca) sends its version and component in the response headers
sailplane-version and sailplane-component of every RPC; a server that cannot be reached is shown
with the reason. The defaults are the local ports of make run and of the microservices.`,
		Example: `  sailplanectl version
  sailplanectl version --xds-address 10.0.0.5:15010 --bus= --ca-address= -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			busCreds, err := busSecurity(security.certDir, security.peers)
			if err != nil {
				return err
			}
			caCreds, unverified, err := caCredentials(rootCert, serverName)
			if err != nil {
				return err
			}
			if clientOnly {
				xds, buses, cas = nil, nil, nil
			}
			var probes []serverVersion
			var creds []credentials.TransportCredentials
			for _, a := range xds {
				probes, creds = append(probes, serverVersion{Role: "xds", Address: a}), append(creds, insecure.NewCredentials())
			}
			for _, a := range buses {
				c := busCreds.ClientCredentials()
				if c == nil {
					c = insecure.NewCredentials()
				}
				probes, creds = append(probes, serverVersion{Role: "bus", Address: a}), append(creds, c)
			}
			for _, a := range cas {
				probes, creds = append(probes, serverVersion{Role: "ca", Address: a, Unverified: unverified}), append(creds, caCreds)
			}
			var wg sync.WaitGroup
			for i := range probes {
				wg.Go(func() { probes[i].probe(cmd.Context(), creds[i], timeout) })
			}
			wg.Wait()

			client := version.Get()
			client.Component = "sailplanectl"
			t := table{header: []string{"ROLE", "ADDRESS", "COMPONENT", "VERSION"}}
			t.add("client", "", client.Component, client.Version)
			for _, p := range probes {
				v := p.Version
				switch {
				case !p.Reachable:
					v = "unreachable: " + p.Error
				case p.Error != "":
					v = p.Error
				case p.Unverified:
					v += " (server certificate not verified: no --root-cert)"
				}
				t.add(p.Role, p.Address, p.Component, v)
			}
			data := struct {
				Client  version.Info    `json:"client"`
				Servers []serverVersion `json:"servers"`
			}{client, probes}
			if probes == nil {
				data.Servers = []serverVersion{}
			}
			return writeOutput(cmd.OutOrStdout(), *format, t, data)
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVar(&xds, "xds-address", []string{"127.0.0.1:15010"}, "plaintext xDS addresses (xds-server, hyper); empty for none")
	fs.StringSliceVar(&buses, "bus", []string{"127.0.0.1:15051", "127.0.0.1:15052", "127.0.0.1:15053"}, "bus addresses (config-ingest, endpoint-watcher, ca); empty for none")
	fs.StringSliceVar(&cas, "ca-address", []string{"127.0.0.1:15012"}, "TLS addresses of the ca, or of hyper's xDS and ca; empty for none")
	fs.StringVar(&rootCert, "root-cert", "", "root certificate that verifies the --ca-address servers (e.g. examples/etc/certs/root-cert.pem); empty: not verified, only the version is read")
	fs.StringVar(&serverName, "tls-server-name", "", "name the --ca-address servers' certificates must carry (default: the address's host)")
	security.addSecurity(fs)
	fs.DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for each server")
	fs.BoolVar(&clientOnly, "client", false, "only sailplanectl's own version")
	format = addOutputFlag(cmd)
	return cmd
}

// caCredentials are the TLS credentials of the ca addresses: verified against rootCert, or, with
// none, unverified (the probe sends nothing but an empty health check).
func caCredentials(rootCert, serverName string) (credentials.TransportCredentials, bool, error) {
	if rootCert == "" {
		return credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}), true, nil // only reads the version (see --root-cert)
	}
	pemData, err := os.ReadFile(rootCert)
	if err != nil {
		return nil, false, fmt.Errorf("--root-cert: %w", err)
	}
	roots, err := pki.ParseCerts(pemData)
	if err != nil || len(roots) == 0 {
		return nil, false, fmt.Errorf("--root-cert %s: no certificate (%v)", rootCert, err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}), false, nil
}

// probe asks the server at p.Address for its version over one connection.
func (p *serverVersion) probe(ctx context.Context, creds credentials.TransportCredentials, timeout time.Duration) {
	if _, _, err := net.SplitHostPort(p.Address); err != nil {
		p.Error = err.Error()
		return
	}
	conn, err := grpc.NewClient(p.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		p.Error = err.Error()
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	info, err := grpcserver.ServerVersion(ctx, conn)
	switch {
	case errors.Is(err, grpcserver.ErrNoVersion):
		p.Reachable, p.Error = true, "no version headers: not Sailplane, or an older build"
	case err != nil:
		p.Error = probeError(err)
	default:
		p.Reachable, p.Component, p.Version = true, info.Component, info.Version
	}
}

// probeError is err without gRPC's layers: "connection refused" rather than the dial's whole
// story.
func probeError(err error) string {
	st := status.Convert(err)
	msg := st.Message()
	if st.Code() == codes.Unavailable {
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = strings.Trim(msg[i+2:], `"`)
		}
	}
	return msg
}
