package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable prints results as a table, one column per run.
func WriteTable(w io.Writer, rs []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(r *Result) string) {
		fmt.Fprint(tw, name+"\t")
		for _, r := range rs {
			fmt.Fprint(tw, f(r)+"\t")
		}
		fmt.Fprintln(tw)
	}
	secs := func(v float64) string { return fmt.Sprintf("%.3f s", v) }
	mode := func(r *Result) string {
		if r.Delta {
			return r.Topology + "/delta"
		}
		return r.Topology + "/sotw"
	}
	row("run", mode)
	row("proxies", func(r *Result) string { return fmt.Sprint(r.Proxies) })
	row("services × endpoints", func(r *Result) string { return fmt.Sprintf("%d×%d", r.Services, r.Endpoints) })
	row("control plane startup", func(r *Result) string { return secs(r.StartupSeconds) })
	row("all connected + synced", func(r *Result) string { return secs(r.AllConnectedSeconds) })
	row("  per proxy p50 / p99", func(r *Result) string {
		return fmt.Sprintf("%.2f / %.2f s", r.Connect.P50, r.Connect.P99)
	})
	row("  not synced / failed", func(r *Result) string { return fmt.Sprintf("%d / %d", r.Connect.Missing, r.Failed) })
	row("  streams retried (overloaded)", func(r *Result) string { return fmt.Sprintf("%d (%d)", r.Retries, r.Refused) })
	row("VirtualService min / p50 / p99", func(r *Result) string {
		return fmt.Sprintf("%.3f / %.3f / %.3f s", r.VirtualService.Min, r.VirtualService.P50, r.VirtualService.P99)
	})
	row("  max (missing)", func(r *Result) string {
		return fmt.Sprintf("%.3f s (%d)", r.VirtualService.Max, r.VirtualService.Missing)
	})
	row("endpoint min / p50 / p99", func(r *Result) string {
		return fmt.Sprintf("%.3f / %.3f / %.3f s", r.Endpoint.Min, r.Endpoint.P50, r.Endpoint.P99)
	})
	row("  max (missing)", func(r *Result) string {
		return fmt.Sprintf("%.3f s (%d)", r.Endpoint.Max, r.Endpoint.Missing)
	})
	names := map[string]bool{}
	for _, r := range rs {
		for n := range r.Usage {
			names[n] = true
		}
	}
	procs := make([]string, 0, len(names))
	for n := range names {
		procs = append(procs, n)
	}
	slices.Sort(procs)
	for _, n := range procs {
		row(n+" CPU s (connect/VS/EP)", func(r *Result) string {
			if _, ok := r.Usage[n]; !ok {
				return "—"
			}
			return fmt.Sprintf("%.1f (%.1f/%.1f/%.1f)", r.Usage[n].CPUSeconds, r.Phases["connect"].CPUSeconds[n],
				r.Phases["virtual_service"].CPUSeconds[n], r.Phases["endpoint"].CPUSeconds[n])
		})
		row(n+" peak RSS", func(r *Result) string {
			if _, ok := r.Usage[n]; !ok {
				return "—"
			}
			return fmt.Sprintf("%.0f MiB", float64(r.Usage[n].PeakRSS)/(1<<20))
		})
	}
	row("loadgen CPU s (connect/VS/EP)", func(r *Result) string {
		return fmt.Sprintf("(%.1f/%.1f/%.1f)", r.Phases["connect"].CPUSeconds[self],
			r.Phases["virtual_service"].CPUSeconds[self], r.Phases["endpoint"].CPUSeconds[self])
	})
	row("bytes sent (connect/VS/EP)", func(r *Result) string {
		return fmt.Sprintf("%s (%s/%s/%s)", size(r.BytesSent), size(r.Phases["connect"].BytesSent),
			size(r.Phases["virtual_service"].BytesSent), size(r.Phases["endpoint"].BytesSent))
	})
	return tw.Flush()
}

func size(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}

// Series is one line of the plot.
type Series struct {
	Name   string
	Color  string
	Dashed bool
	Points [][2]float64 // x = proxies, y = seconds
}

// Reference is a horizontal line on the plot, such as a target.
type Reference struct {
	Name    string
	Color   string
	Seconds float64
}

// Targets are issue 4's convergence targets at 2,000 proxies.
var Targets = []Reference{
	{"target: all connected < 20 s", "#1f77b4", 20},
	{"target: VirtualService p99 < 3 s", "#d62728", 3},
	{"target: endpoint p99 < 250 ms", "#2ca02c", 0.25},
}

// PlotSeries are the convergence lines of results: all connected, VirtualService p99 and
// endpoint p99, against the proxy count, one set per topology and protocol. The metric picks
// the hue (darker for hyper), delta is dashed.
func PlotSeries(rs []*Result) []Series {
	type key struct {
		topo  string
		delta bool
	}
	groups := map[key][]*Result{}
	var keys []key
	for _, r := range rs {
		k := key{r.Topology, r.Delta}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	palette := map[string][2]string{
		"all connected":      {"#1f77b4", "#7fb2dc"},
		"VirtualService p99": {"#d62728", "#f08a8b"},
		"endpoint p99":       {"#2ca02c", "#8fd18f"},
	}
	var out []Series
	for _, k := range keys {
		g := groups[k]
		slices.SortFunc(g, func(a, b *Result) int { return a.Proxies - b.Proxies })
		mode := "sotw"
		if k.delta {
			mode = "delta"
		}
		shade := 0
		if k.topo != TopologyHyper {
			shade = 1
		}
		for _, m := range []struct {
			what string
			f    func(*Result) float64
		}{
			{"all connected", func(r *Result) float64 { return r.AllConnectedSeconds }},
			{"VirtualService p99", func(r *Result) float64 { return r.VirtualService.P99 }},
			{"endpoint p99", func(r *Result) float64 { return r.Endpoint.P99 }},
		} {
			s := Series{Name: fmt.Sprintf("%s %s: %s", k.topo, mode, m.what), Color: palette[m.what][shade], Dashed: k.delta}
			for _, r := range g {
				s.Points = append(s.Points, [2]float64{float64(r.Proxies), m.f(r)})
			}
			out = append(out, s)
		}
	}
	return out
}

// WriteSVG draws series on a log-scale seconds axis against a linear proxy-count axis.
func WriteSVG(w io.Writer, title string, series []Series, refs []Reference) error {
	const (
		width, height = 980, 520
		left, right   = 70, 360
		top, bottom   = 40, 50
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	maxX, minY, maxY := 1.0, math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, p := range s.Points {
			maxX = max(maxX, p[0])
			if p[1] > 0 {
				minY, maxY = min(minY, p[1]), max(maxY, p[1])
			}
		}
	}
	for _, r := range refs {
		minY, maxY = min(minY, r.Seconds), max(maxY, r.Seconds)
	}
	if math.IsInf(minY, 0) {
		minY, maxY = 0.01, 1
	}
	lo, hi := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if hi <= lo {
		hi = lo + 1
	}
	x := func(v float64) float64 { return float64(left) + v/maxX*pw }
	y := func(v float64) float64 {
		v = max(v, math.Pow(10, lo))
		return float64(top) + ph - (math.Log10(v)-lo)/(hi-lo)*ph
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, escape(title))
	// Axes and grid.
	for e := lo; e <= hi; e++ {
		v := math.Pow(10, e)
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, float64(left)+pw, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, seconds(v))
	}
	xs := map[float64]bool{}
	for _, s := range series {
		for _, p := range s.Points {
			xs[p[0]] = true
		}
	}
	for v := range xs {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#eee"/>`+"\n", x(v), x(v), top, float64(top)+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", x(v), float64(top)+ph+16, v)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">simulated sidecars</text>`+"\n", float64(left)+pw/2, height-10)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">seconds (log scale)</text>`+"\n", float64(top)+ph/2)
	for _, r := range refs {
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="2 3"/>`+"\n",
			left, float64(left)+pw, y(r.Seconds), y(r.Seconds), r.Color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="%s" font-size="10">%s</text>`+"\n",
			float64(left)+pw-4, y(r.Seconds)-3, r.Color, escape(r.Name))
	}
	for i, s := range series {
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 3"`
		}
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.Color, dash, strings.Join(pts, " "))
		for _, p := range s.Points {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %g proxies, %s</title></circle>`+"\n",
				x(p[0]), y(p[1]), s.Color, escape(s.Name), p[0], seconds(p[1]))
		}
		ly := top + 10 + i*18
		lx := width - right + 12
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, lx+22, ly, ly, s.Color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+28, ly+4, escape(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func seconds(v float64) string {
	switch {
	case v >= 1:
		return fmt.Sprintf("%g s", v)
	case v >= 0.001:
		return fmt.Sprintf("%g ms", math.Round(v*1e6)/1e3)
	}
	return fmt.Sprintf("%g µs", math.Round(v*1e9)/1e3)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// WriteMarkdown writes one table row per run, for docs/benchmarks.md.
func WriteMarkdown(w io.Writer, rs []*Result) error {
	var b strings.Builder
	b.WriteString("| topology | xDS | proxies | all connected | VirtualService p50 / p99 | endpoint p50 / p99 | xDS process CPU s (connect / VS / EP) | xDS process peak RSS | bytes sent (connect / VS / EP) |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		mode := "SotW"
		if r.Delta {
			mode = "delta"
		}
		u := r.Usage[r.XDSProcess]
		cpu := func(ph string) float64 { return r.Phases[ph].CPUSeconds[r.XDSProcess] }
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f s | %s / %s | %s / %s | %.1f (%.1f / %.1f / %.1f) | %.0f MiB | %s (%s / %s / %s) |\n",
			r.Topology, mode, r.Proxies, r.AllConnectedSeconds,
			ms(r.VirtualService.P50), ms(r.VirtualService.P99), ms(r.Endpoint.P50), ms(r.Endpoint.P99),
			u.CPUSeconds, cpu("connect"), cpu("virtual_service"), cpu("endpoint"), float64(u.PeakRSS)/(1<<20),
			size(r.BytesSent), size(r.Phases["connect"].BytesSent), size(r.Phases["virtual_service"].BytesSent),
			size(r.Phases["endpoint"].BytesSent))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ms(s float64) string { return fmt.Sprintf("%.0f ms", s*1000) }
