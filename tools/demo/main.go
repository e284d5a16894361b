// Command demo is the quick start's pair of gRPC services: an echo server that answers with its
// ID and a client that counts which server answered, both proxyless gRPC applications that take
// everything from Sailplane's xDS (the server its listener, the client its routes, clusters and
// endpoints), bootstrapped as any gRPC xDS application is, from $GRPC_XDS_BOOTSTRAP
// (`sailplanectl bootstrap grpc` writes one).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds" // also registers the xds:/// resolver

	"sailplane.dev/shared/cli"
	"sailplane.dev/tools/demo/echo"
)

func main() { cli.Execute(newCommand()) }

func newCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "demo",
		Short: "The quick start's gRPC echo server and client, proxyless through Sailplane's xDS",
	}
	root.AddCommand(serverCmd(), clientCmd())
	return root
}

// errNoBootstrap is returned when gRPC has no xDS bootstrap to read.
var errNoBootstrap = errors.New("no xDS bootstrap: set GRPC_XDS_BOOTSTRAP to a file `sailplanectl bootstrap grpc` wrote")

func checkBootstrap() error {
	if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		return errNoBootstrap
	}
	return nil
}

func serverCmd() *cobra.Command {
	var id, listen string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Serve the echo service, answering with --id, once Sailplane sent this address's listener",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkBootstrap(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			// The server accepts RPCs only once xDS gave it the listener of its address.
			srv, err := xds.NewGRPCServer(grpc.Creds(insecure.NewCredentials()),
				xds.ServingModeCallback(func(addr net.Addr, args xds.ServingModeChangeArgs) {
					if args.Mode == connectivity.ServingModeServing {
						log.Info("serving", "id", id, "address", addr.String())
						return
					}
					log.Warn("not serving", "id", id, "address", addr.String(), "reason", args.Err)
				}))
			if err != nil {
				return err
			}
			echo.Register(srv, &echo.Server{ID: id})
			go func() {
				<-ctx.Done()
				srv.GracefulStop()
			}()
			log.Info("waiting for the listener from xDS", "id", id, "address", lis.Addr().String())
			return srv.Serve(lis)
		},
	}
	cmd.Flags().StringVar(&id, "id", "echo", "the ID the server answers with")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:17070", "address to serve on (the registry must have an endpoint there)")
	return cmd
}

func clientCmd() *cobra.Command {
	var (
		count   int
		headers []string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "client TARGET",
		Short: "Send --count RPCs to TARGET (xds:///<host>:<port>) and print how many each server answered",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkBootstrap(); err != nil {
				return err
			}
			md, err := headerPairs(headers)
			if err != nil {
				return err
			}
			conn, err := grpc.NewClient(args[0], grpc.WithTransportCredentials(insecure.NewCredentials()),
				// Wait for xDS to give the channel somewhere to go instead of failing at once.
				grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			counts, err := echo.Count(ctx, echo.NewClient(conn), count, md...)
			if err != nil {
				return err
			}
			return counts.Print(cmd.OutOrStdout())
		},
	}
	cmd.Flags().IntVar(&count, "count", 1000, "how many RPCs to send")
	cmd.Flags().StringArrayVar(&headers, "header", nil, "a request header, key=value (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// headerPairs turns key=value flags into metadata pairs.
func headerPairs(flags []string) ([]string, error) {
	var out []string
	for _, h := range flags {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--header %q: want key=value", h)
		}
		out = append(out, strings.ToLower(k), v)
	}
	return out, nil
}
