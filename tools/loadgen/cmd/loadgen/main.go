// Command loadgen benchmarks Sailplane's xDS serving with simulated Envoy sidecars: it writes a
// mesh of services as ServiceEntry + WorkloadEntry files, starts hyper or the microservices
// from bin/, connects the sidecars and measures convergence, CPU, peak RSS and bytes sent.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sailplane.dev/tools/loadgen"
)

func main() {
	var (
		sc       loadgen.Scenario
		counts   string
		delta    string
		topos    string
		jsonOut  string
		plotOut  string
		mdOut    string
		fromJSON string
		duration time.Duration
		logLevel string
		proxies  int
		selfProf string
		gwAPI    loadgen.GatewayAPI
	)
	cmd := &cobra.Command{
		Use:   "loadgen",
		Short: "Simulated Envoy sidecars against Sailplane's xDS server: convergence, CPU, memory, bytes",
		Long: `loadgen runs bounded scenarios. For each topology, protocol and proxy count it writes the
mesh config, starts the control plane (or uses --xds for an external one), connects the
sidecars (connect storm), changes a VirtualService --changes times and an endpoint --changes
times, measuring when every proxy has the change, then stops everything.

With --gateways N it runs the gateway scenario instead: N Gateways (class istio) and --routes
HTTPRoutes (one file each) on the mesh's services, one simulated gateway proxy (router node)
per Gateway; it edits --changes HTTPRoutes (default 40) one at a time, measuring each edit to
its gateway proxy's ACK, counting pushes to the other gateways, and reads the serving
process's memory from its /metrics.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			sc.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			if selfProf != "" {
				// The load generator shares the machine with the server it measures: its own
				// profile says how much of a phase's time is the instrument's.
				f, err := os.Create(selfProf)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, duration)
			defer cancel()

			ns := []int{proxies}
			if counts != "" {
				ns = nil
				for f := range strings.SplitSeq(counts, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(f))
					if err != nil {
						return fmt.Errorf("--proxies-list: %w", err)
					}
					ns = append(ns, n)
				}
			}
			if limit, err := loadgen.RaiseFileLimit(); err != nil {
				sc.Logger.Warn("open-file limit not raised", "err", err)
			} else if need := uint64(slices.Max(ns)) + 1000; limit < need {
				sc.Logger.Warn("open-file limit below one descriptor per proxy: raise the hard limit (ulimit -Hn)", "limit", limit, "want", need)
			}
			if sc.XDS != "" && !cmd.Flags().Changed("topology") {
				topos = loadgen.TopologyExternal
			}
			var modes []bool
			for m := range strings.SplitSeq(delta, ",") {
				switch strings.TrimSpace(m) {
				case "sotw", "false":
					modes = append(modes, false)
				case "delta", "true":
					modes = append(modes, true)
				default:
					return fmt.Errorf("--protocol: want sotw, delta or both, got %q", m)
				}
			}
			if gwAPI.Gateways > 0 {
				return runGateways(ctx, sc, gwAPI, topos, modes, jsonOut, cmd.Flags().Changed("changes"))
			}
			var results []*loadgen.Result
			var firstErr error
			if fromJSON != "" {
				b, err := os.ReadFile(fromJSON)
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &results); err != nil {
					return fmt.Errorf("%s: %w", fromJSON, err)
				}
				topos = "" // report only
			}
			for topo := range strings.SplitSeq(topos, ",") {
				if topo == "" {
					continue
				}
				for _, d := range modes {
					for _, n := range ns {
						run := sc
						run.Topology, run.Delta, run.Proxies = strings.TrimSpace(topo), d, n
						sc.Logger.Info("running", "topology", run.Topology, "delta", d, "proxies", n)
						r, err := run.Run(ctx)
						if r != nil {
							results = append(results, r)
						}
						if err != nil {
							sc.Logger.Error("scenario failed", "topology", run.Topology, "delta", d, "proxies", n, "err", err)
							firstErr = cmp(firstErr, err)
						}
						if ctx.Err() != nil {
							break
						}
					}
				}
			}
			if err := loadgen.WriteTable(os.Stdout, results); err != nil {
				return err
			}
			if jsonOut != "" {
				b, err := json.MarshalIndent(results, "", "  ")
				if err != nil {
					return err
				}
				if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
					return err
				}
			}
			if mdOut != "" {
				f, err := os.Create(mdOut)
				if err != nil {
					return err
				}
				if err := loadgen.WriteMarkdown(f, results); err != nil {
					_ = f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			if plotOut != "" && len(results) > 0 {
				if err := os.MkdirAll(filepath.Dir(plotOut), 0o755); err != nil {
					return err
				}
				f, err := os.Create(plotOut)
				if err != nil {
					return err
				}
				title := fmt.Sprintf("Sailplane xDS convergence, %d services × %d endpoints, no Sidecar scoping",
					results[0].Services, results[0].Endpoints)
				if err := loadgen.WriteSVG(f, title, loadgen.PlotSeries(results), loadgen.Targets); err != nil {
					_ = f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			return firstErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&sc.XDS, "xds", "", "xDS address of a control plane started elsewhere (implies --topology external; it must read --config-dir/conf)")
	f.StringVar(&topos, "topology", loadgen.TopologyHyper, "comma-separated: hyper, microservices, external")
	f.StringVar(&sc.Bin, "bin", "bin", "folder holding the binaries (make build)")
	f.StringVar(&sc.ConfigDir, "config-dir", "", "where the mesh config is written (default: a temporary folder)")
	f.IntVar(&proxies, "proxies", 200, "simulated sidecars")
	f.StringVar(&counts, "proxies-list", "", "comma-separated proxy counts, one run each (overrides --proxies), e.g. 100,500,1000,2000")
	f.StringVar(&delta, "protocol", "sotw", "comma-separated: sotw, delta")
	f.BoolVar(new(bool), "delta", false, "shorthand for --protocol delta")
	f.StringVar(&sc.Mesh.Namespace, "namespace", "load", "namespace of the services and sidecars")
	f.IntVar(&sc.Mesh.Services, "services", 100, "services (ServiceEntry)")
	f.IntVar(&sc.Mesh.Endpoints, "endpoints", 2, "endpoints per service (WorkloadEntry)")
	f.Float64Var(&sc.Ramp, "ramp", 0, "connections opened per second; 0 opens them all at once")
	f.IntVar(&sc.Changes, "changes", 3, "VirtualService and endpoint changes measured")
	f.DurationVar(&sc.PhaseTimeout, "phase-timeout", 5*time.Minute, "longest one phase may take")
	f.DurationVar(&duration, "duration", 30*time.Minute, "longest the whole invocation may take")
	f.IntVar(&sc.XDSServers, "xds-servers", 1, "microservices: xds-server processes on the same buses, proxy i on server i mod N (2: the Deployment topology; one per node: node-local)")
	f.StringSliceVar(&sc.ServerArgs, "server-arg", nil, "extra argument for xds-server (microservices) or hyper, repeatable")
	f.StringVar(&sc.Pprof, "pprof", "", "xds-server pprof address to profile (start it with --server-arg=--pprof-addr=ADDR)")
	f.StringVar(&sc.ProfileDir, "profile-dir", ".", "where profiles are written")
	f.IntVar(&sc.ProfileSeconds, "profile-seconds", 5, "length of each phase's CPU profile")
	f.StringVar(&jsonOut, "json", "", "write the results as JSON to this file")
	f.StringVar(&plotOut, "plot", "", "write an SVG plot of convergence time against proxy count to this file")
	f.StringVar(&mdOut, "markdown", "", "write a Markdown table of the results to this file")
	f.StringVar(&fromJSON, "from-json", "", "do not run: report (table, --markdown, --plot) the results of an earlier --json")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn, error")
	f.IntVar(&gwAPI.Gateways, "gateways", 0, "run the gateway scenario instead: this many Gateways (class istio), one simulated gateway proxy each")
	f.IntVar(&gwAPI.Routes, "routes", 1000, "gateway scenario: HTTPRoutes spread over the Gateways, one file each; --changes of them are edited (default 40)")
	f.StringVar(&selfProf, "self-cpuprofile", "", "write the load generator's own CPU profile (whole invocation) to this file")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if d, _ := cmd.Flags().GetBool("delta"); d && !cmd.Flags().Changed("protocol") {
			delta = "delta"
		}
		return nil
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// runGateways runs the gateway scenario for each topology and protocol and reports it.
func runGateways(ctx context.Context, sc loadgen.Scenario, g loadgen.GatewayAPI, topos string, modes []bool,
	jsonOut string, changesSet bool) error {
	if !changesSet {
		sc.Changes = 40
	}
	var results []*loadgen.GatewayResult
	var firstErr error
	for topo := range strings.SplitSeq(topos, ",") {
		for _, d := range modes {
			run := sc
			run.Topology, run.Delta = strings.TrimSpace(topo), d
			sc.Logger.Info("running gateways", "topology", run.Topology, "delta", d, "gateways", g.Gateways, "routes", g.Routes)
			r, err := run.RunGateways(ctx, g)
			if r != nil {
				results = append(results, r)
			}
			if err != nil {
				sc.Logger.Error("scenario failed", "topology", run.Topology, "delta", d, "err", err)
				firstErr = cmp(firstErr, err)
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	if err := loadgen.WriteGatewayTable(os.Stdout, results); err != nil {
		return err
	}
	if jsonOut != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return firstErr
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
