package loadgen

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

func results() []*Result {
	var rs []*Result
	for _, delta := range []bool{false, true} {
		for i, n := range []int{100, 2000} {
			rs = append(rs, &Result{Topology: TopologyHyper, Delta: delta, Proxies: n, Services: 10, Endpoints: 2,
				AllConnectedSeconds: float64(i + 1), VirtualService: Latency{P50: .2, P99: .3}, Endpoint: Latency{P50: .1, P99: .12},
				XDSProcess: "hyper", Usage: map[string]Usage{"hyper": {CPUSeconds: 2, PeakRSS: 100 << 20}},
				Phases: map[string]Phase{"connect": {CPUSeconds: map[string]float64{"hyper": 1}, BytesSent: 1 << 20}}})
		}
	}
	return rs
}

// TestReports: the SVG is well-formed XML naming every series, the tables hold every run.
func TestReports(t *testing.T) {
	rs := results()
	series := PlotSeries(rs)
	if len(series) != 6 {
		t.Fatalf("%d series, want 3 metrics × 2 protocols", len(series))
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, "title & <more>", series, Targets); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg.Bytes()))
	for {
		_, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
	}
	for _, s := range series {
		if !strings.Contains(svg.String(), s.Name) {
			t.Errorf("SVG misses %q", s.Name)
		}
	}
	var md, table bytes.Buffer
	if err := WriteMarkdown(&md, rs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(md.String(), "\n"); got != 2+len(rs) {
		t.Errorf("markdown has %d lines, want %d", got, 2+len(rs))
	}
	if err := WriteTable(&table, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "hyper/delta") {
		t.Errorf("table misses the delta runs:\n%s", table.String())
	}
}

// TestRequestCodec: requests with shared, pre-encoded name lists decode like proto.Marshal's.
func TestRequestCodec(t *testing.T) {
	c := newRequestCodec()
	var names []string
	for i := range 40 {
		names = append(names, "outbound|8080||svc-"+itoa(i))
	}
	for range 2 { // the second time from the cache
		req := &discoverygrpc.DiscoveryRequest{TypeUrl: EndpointType, VersionInfo: "v", ResponseNonce: "n",
			ResourceNames: names, Node: &corev3.Node{Id: "x"}}
		data, err := c.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var got discoverygrpc.DiscoveryRequest
		if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, req) {
			t.Fatalf("got %v, want %v", &got, req)
		}
	}
}
