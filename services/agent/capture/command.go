package capture

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/capture"
)

// CommandOptions are the flags of `agent capture` that are not Istio's capture flags.
type CommandOptions struct {
	Capture    capture.Flags
	Backend    string // auto, nftables, iptables
	IPv6       string // auto, true, false
	DryRun     bool
	Cleanup    bool
	ResolvConf string
	// Validate checks capture instead of installing it (the validation init container of CNI
	// mode), for ValidateTimeout.
	Validate        bool
	ValidateTimeout time.Duration
}

// AddFlags registers the command's flags.
func (o *CommandOptions) AddFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	o.Capture.AddFlags(fs)
	fs.StringVar(&o.Backend, "backend", "auto", "nftables, iptables, or auto: nftables when nft is installed")
	fs.StringVar(&o.IPv6, "ipv6", "auto", "install the IPv6 rules: true, false, or auto: when the namespace has a global IPv6 address")
	fs.BoolVarP(&o.DryRun, "dry-run", "n", false, "print the rules instead of installing them")
	fs.BoolVar(&o.Cleanup, "cleanup-only", false, "remove the capture rules (either backend) and routes, install nothing")
	fs.BoolVar(&o.Validate, "validate", false, "check that capture is in place (connect through the capture ports, read the original destination) instead of installing it; run as the proxy's uid, without capabilities (CNI mode's validation)")
	fs.DurationVar(&o.ValidateTimeout, "validate-timeout", 5*time.Second, "how long --validate waits for a captured connection")
	fs.StringVar(&o.ResolvConf, "resolv-conf", "/etc/resolv.conf", "where DNS capture reads the servers to capture, without --dns-servers")
}

// Run does what the command line says, in the current network namespace; out gets --dry-run's
// rules.
func (o *CommandOptions) Run(ctx context.Context, log *slog.Logger, out io.Writer) error {
	start := time.Now()
	cfg, err := o.Capture.Config()
	if err != nil {
		return err
	}
	if o.Validate {
		if cfg.Mode == capture.None {
			return nil
		}
		return Validate(ctx, log, cfg.ProxyPort, cfg.InboundCapturePort, o.ValidateTimeout)
	}
	if cfg.DNS && !cfg.CaptureAllDNS && !o.Capture.DNSServersSet() {
		servers, err := resolvServers(o.ResolvConf)
		if err != nil {
			return fmt.Errorf("DNS capture: %w", err)
		}
		cfg.DNSServers = servers
	}
	if cfg.DNS && !cfg.CaptureAllDNS && len(cfg.DNSServers) == 0 {
		log.Warn("DNS capture is on, but there is no DNS server to capture (none in resolv.conf, no --dns-servers, no --capture-all-dns): DNS is not captured")
	}
	opts := Options{}
	switch o.IPv6 {
	case "auto":
		opts.IPv6 = HasIPv6()
	case "true":
		opts.IPv6 = true
	case "false":
	default:
		return fmt.Errorf("flag --ipv6: invalid value %q: want auto, true or false", o.IPv6)
	}
	backend := Backend(o.Backend)
	switch backend {
	case "auto":
		backend = DetectBackend()
	case NFTables, IPTables:
	default:
		return fmt.Errorf("flag --backend: invalid value %q: want auto, nftables or iptables", o.Backend)
	}
	rules := Build(cfg, opts)
	if o.DryRun {
		if backend == NFTables {
			_, err = io.WriteString(out, rules.NFTText())
			return err
		}
		text := rules.IPTables(V4)
		if opts.IPv6 {
			text += "# ip6tables-restore\n" + rules.IPTables(V6)
		}
		_, err = io.WriteString(out, text)
		return err
	}
	in := Installer{Backend: backend, Log: log}
	if o.Cleanup {
		if err := in.Cleanup(ctx); err != nil {
			return err
		}
		if err := CleanupRoutes(ctx, cfg.TProxyMark, cfg.TProxyRouteTable); err != nil {
			return err
		}
		log.Info("capture rules removed", "took", time.Since(start))
		return nil
	}
	if cfg.Mode == capture.None {
		log.Info("interception mode NONE: no capture")
		return nil
	}
	changed, err := in.Apply(ctx, rules)
	if err != nil {
		return err
	}
	if err := RoutesFor(cfg, opts).Apply(ctx); err != nil {
		return err
	}
	log.Info("capture ready", "backend", backend, "mode", cfg.Mode, "ipv6", opts.IPv6, "changed", changed, "took", time.Since(start))
	return nil
}

// HasIPv6 is whether an interface has a global IPv6 address (a pod with an IPv6 address,
// alone or dual-stack, gets the IPv6 rules).
func HasIPv6() bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if ok && ip.Is6() && !ip.Is4In6() && ip.IsGlobalUnicast() {
			return true
		}
	}
	return false
}

// resolvServers are resolv.conf's nameservers.
func resolvServers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		// A zone (fe80::1%eth0) cannot be matched by a rule; Istio skips such too.
		a, err := netip.ParseAddr(fields[1])
		if err != nil || a.Zone() != "" {
			continue
		}
		out = append(out, a.Unmap())
	}
	return out, sc.Err()
}
