package monitoring

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"time"
)

// StatusSources are a service's sections of the status page; a nil one is left out.
type StatusSources struct {
	// Proxies are the connected proxies with their sync state (xds-server).
	Proxies func() []ProxyStatus
	// Problems are the config problems (config-ingest).
	Problems func() []ConfigProblem
	// Pushes are recent pushes to proxies, oldest first, for the convergence chart (xds-server).
	Pushes func() []PushTiming
	// GatewayAPI is the status computed for each Kubernetes Gateway API object (config-ingest):
	// what it writes to the API server, or in files mode what it would.
	GatewayAPI func() []GatewayAPIStatus
}

// GatewayAPIStatus is one Gateway API object's computed status, summed up.
type GatewayAPIStatus struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Conditions are "Type=Status (Reason): message", each prefixed by its scope when it is not
	// the object's own: "listener http: ", "parent default/gw: ".
	Conditions []string `json:"conditions"`
	// OK is false when a condition says something is wrong (Accepted, Programmed or
	// ResolvedRefs not True, Conflicted True).
	OK bool `json:"ok"`
}

// ProxyStatus is one connected proxy.
type ProxyStatus struct {
	// ID is "<pod>.<namespace>"; NodeID the whole node ID.
	ID, NodeID string
	// Type is sidecar, router or proxyless.
	Type, Cluster string
	// Version is its ISTIO_VERSION metadata, if any.
	Version     string
	ConnectedAt time.Time
	Watches     []WatchStatus
}

// Sync states of a watched type, as istioctl proxy-status names them (istiod's ERROR for a NACK
// is NACKED here, which says what happened).
const (
	Synced  = "SYNCED"
	Stale   = "STALE"
	Nacked  = "NACKED"
	NotSent = "NOT_SENT"
)

// WatchStatus is the sync state of one type a proxy watches.
type WatchStatus struct {
	// Type is the short name (CDS, LDS, ...), TypeURL the whole type.
	Type, TypeURL string
	// State is Synced, Stale, Nacked or NotSent.
	State string
	// Version is the version last sent.
	Version string
	// Error is the last NACK's message, while State is Nacked.
	Error string
}

// ConfigProblem is one config problem, with where it is.
type ConfigProblem struct {
	// File is the file (or folder, or source) at fault; empty for a Kubernetes resource.
	File string `json:"file,omitempty"`
	// Document is the 1-based document in File; 0 when unknown.
	Document  int    `json:"document,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// Field is the offending field's path ("spec.http[0].route[0].weight"); empty when the
	// whole document is at fault.
	Field string `json:"field,omitempty"`
	// Message is the cause alone; Error the whole message, as logged.
	Message string `json:"message"`
	Error   string `json:"error"`
}

// Resource is "Kind namespace/name", or what of it is known.
func (p ConfigProblem) Resource() string {
	name := p.Name
	if p.Namespace != "" {
		name = p.Namespace + "/" + name
	}
	switch {
	case p.Kind == "":
		return name
	case name == "":
		return p.Kind
	}
	return p.Kind + " " + name
}

// PushTiming is one finished push to one proxy.
type PushTiming struct {
	Proxy string
	// Done is when its last response was sent; Convergence how long after the change was first
	// seen.
	Done        time.Time
	Convergence time.Duration
	Failed      bool
}

// statusPage renders the status page from its sources.
type statusPage struct {
	title     string
	sources   StatusSources
	endpoints []string
}

func (p *statusPage) add(s StatusSources) { mergeSources(&p.sources, s) }

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ago": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
}).Parse(statusHTML))

// statusView is what the template renders; a nil section is left out.
type statusView struct {
	Title     string
	Now       time.Time
	Proxies   *[]ProxyStatus
	Problems  *[]ConfigProblem
	Gateways  *[]GatewayAPIStatus
	Chart     *chart
	Endpoints []string
}

func (p *statusPage) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	v := statusView{Title: p.title, Now: time.Now(), Endpoints: p.endpoints}
	if p.sources.Proxies != nil {
		proxies := p.sources.Proxies()
		v.Proxies = &proxies
	}
	if p.sources.Problems != nil {
		problems := p.sources.Problems()
		v.Problems = &problems
	}
	if p.sources.GatewayAPI != nil {
		gws := p.sources.GatewayAPI()
		v.Gateways = &gws
	}
	if p.sources.Pushes != nil {
		v.Chart = newChart(p.sources.Pushes())
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, v); err != nil {
		http.Error(w, fmt.Sprintf("rendering the status page: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// chart is the convergence-time chart, laid out for SVG: time across, convergence time up on a
// log scale (pushes take from milliseconds to tens of seconds).
type chart struct {
	Width, Height            float64
	Left, Right, Top, Bottom float64
	Points                   []chartPoint
	YTicks, XTicks           []chartTick
	Pushes, Failed           int
	Slowest                  time.Duration
}

type chartPoint struct {
	X, Y   float64
	Title  string
	Failed bool
}

type chartTick struct {
	At    float64
	Label string
}

func newChart(pushes []PushTiming) *chart {
	c := &chart{Width: 760, Height: 260, Left: 60, Right: 710, Top: 16, Bottom: 230, Pushes: len(pushes)}
	if len(pushes) == 0 {
		return c
	}
	pushes = slices.SortedFunc(slices.Values(pushes), func(a, b PushTiming) int { return a.Done.Compare(b.Done) })
	ms := func(d time.Duration) float64 { return max(float64(d)/float64(time.Millisecond), 0.1) }
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pushes {
		v := math.Log10(ms(p.Convergence))
		lo, hi = min(lo, v), max(hi, v)
		c.Slowest = max(c.Slowest, p.Convergence)
		if p.Failed {
			c.Failed++
		}
	}
	// Whole decades, with room so that no point sits on the plot's edge.
	lo, hi = math.Floor(lo-0.1), math.Ceil(hi+0.1)
	t0, t1 := pushes[0].Done, pushes[len(pushes)-1].Done
	span := t1.Sub(t0)
	if span <= 0 {
		span = time.Second
	}
	x := func(t time.Time) float64 { return c.Left + (c.Right-c.Left)*float64(t.Sub(t0))/float64(span) }
	y := func(v float64) float64 { return c.Bottom - (c.Bottom-c.Top)*(v-lo)/(hi-lo) }
	for d := lo; d <= hi; d++ {
		c.YTicks = append(c.YTicks, chartTick{At: y(d), Label: decade(d)})
	}
	for _, f := range []float64{0, 0.5, 1} {
		t := t0.Add(time.Duration(f * float64(span)))
		c.XTicks = append(c.XTicks, chartTick{At: x(t), Label: t.Format(time.TimeOnly)})
	}
	c.Slowest = c.Slowest.Round(100 * time.Microsecond)
	for _, p := range pushes {
		title := fmt.Sprintf("%s: %v at %s", p.Proxy, p.Convergence.Round(100*time.Microsecond), p.Done.Format(time.TimeOnly))
		if p.Failed {
			title += " (failed)"
		}
		c.Points = append(c.Points, chartPoint{X: x(p.Done), Y: y(math.Log10(ms(p.Convergence))), Title: title, Failed: p.Failed})
	}
	return c
}

// decade labels 10^d milliseconds.
func decade(d float64) string {
	v := time.Duration(math.Pow(10, d) * float64(time.Millisecond))
	return v.String()
}
