package capture

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"sailplane.dev/shared/capture"
)

// Routes are what the rules need besides rules: in TPROXY mode, marked packets are routed to
// the local stack (`ip rule fwmark <mark> lookup <table>` and `ip route local default dev lo
// table <table>`, per family); with IPv6, the address ::6 on lo, which Envoy's inbound
// passthrough binds to (IPv4's 127.0.0.6 is already local: lo holds 127.0.0.0/8).
type Routes struct {
	TProxy     bool
	Mark       uint32
	Table      int
	IPv6       bool
	addressSix bool
}

// RoutesFor are the routes of c.
func RoutesFor(c capture.Config, o Options) Routes {
	tproxy := c.Mode == capture.TProxy && (c.InboundPorts.All || len(c.InboundPorts.List) > 0)
	return Routes{TProxy: tproxy, Mark: c.TProxyMark, Table: c.TProxyRouteTable, IPv6: o.IPv6, addressSix: o.IPv6 && c.Mode != capture.None}
}

// families are ip's -4/-6 for the routes.
func (rt Routes) families() []string {
	if rt.IPv6 {
		return []string{"-4", "-6"}
	}
	return []string{"-4"}
}

// Apply adds the routes unless present (ip rule would add a duplicate each run), and removes
// the TPROXY ones an earlier TPROXY run left when this one is not.
func (rt Routes) Apply(ctx context.Context) error {
	if !rt.TProxy {
		if err := cleanupTProxy(ctx, rt.Mark, rt.Table); err != nil {
			return err
		}
	}
	if rt.TProxy {
		mark, table := strconv.FormatUint(uint64(rt.Mark), 10), strconv.Itoa(rt.Table)
		for _, fam := range rt.families() {
			out, err := runCmd(ctx, "", "ip", fam, "rule", "show", "fwmark", mark, "lookup", table)
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) == "" {
				if _, err := runCmd(ctx, "", "ip", fam, "rule", "add", "fwmark", mark, "lookup", table); err != nil {
					return err
				}
			}
			if _, err := runCmd(ctx, "", "ip", fam, "route", "replace", "local", "default", "dev", "lo", "table", table); err != nil {
				return err
			}
		}
	}
	if rt.addressSix {
		// nodad: the address is the pod's own, on loopback; duplicate address detection would
		// only leave it tentative (unusable) for its first second.
		if _, err := runCmd(ctx, "", "ip", "-6", "addr", "replace", "::6/128", "dev", "lo", "nodad"); err != nil {
			return fmt.Errorf("the inbound passthrough address: %w", err)
		}
	}
	return nil
}

// CleanupRoutes removes what Apply may have added for mark and table (in both families).
func CleanupRoutes(ctx context.Context, mark uint32, table int) error {
	var errs []error
	errs = append(errs, cleanupTProxy(ctx, mark, table))
	if out, _ := runCmd(ctx, "", "ip", "-6", "addr", "show", "dev", "lo"); strings.Contains(out, "inet6 ::6/128") {
		if _, err := runCmd(ctx, "", "ip", "-6", "addr", "del", "::6/128", "dev", "lo"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func cleanupTProxy(ctx context.Context, mark uint32, table int) error {
	m, t := strconv.FormatUint(uint64(mark), 10), strconv.Itoa(table)
	var errs []error
	for _, fam := range []string{"-4", "-6"} {
		for {
			out, err := runCmd(ctx, "", "ip", fam, "rule", "show", "fwmark", m, "lookup", t)
			if err != nil || strings.TrimSpace(out) == "" {
				break
			}
			if _, err := runCmd(ctx, "", "ip", fam, "rule", "del", "fwmark", m, "lookup", t); err != nil {
				errs = append(errs, err)
				break
			}
		}
		if out, _ := runCmd(ctx, "", "ip", fam, "route", "show", "table", t); strings.TrimSpace(out) != "" {
			if _, err := runCmd(ctx, "", "ip", fam, "route", "flush", "table", t); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
