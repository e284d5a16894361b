// Command dumpxds writes what envoygen serves each proxy of a golden case folder, as JSON
// snapshots (type URL → list of Any) that tools/xdssim reads as test input. The tools module
// cannot import xds-server's internal packages, so the snapshots are generated here and committed.
//
//	go run ./services/xds-server/internal/cmd/dumpxds -out tools/xdssim/testdata \
//	    services/xds-server/internal/envoygen/testdata/{gateway-http,vs-match,...}
//
// writes <out>/<case>/<proxy>.xds.json for every Proxy document of each case.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"sailplane.dev/services/xds-server/internal/envoygen"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/testinput"
)

func main() {
	out := flag.String("out", "", "folder to write <case>/<proxy>.xds.json under")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: dumpxds -out DIR CASE_DIR...")
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		if err := dump(dir, *out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func dump(dir, out string) error {
	proxies, rest, err := testinput.ReadCase(dir)
	if err != nil {
		return err
	}
	items, err := testinput.Parse(rest)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	store := model.NewStore()
	h := store.Handler(nil)
	for _, c := range testinput.Changes(items) {
		if err := h.Apply(c); err != nil {
			return fmt.Errorf("%s: apply %s: %w", dir, c.TypeURL, err)
		}
	}
	_, statErr := os.Stat(filepath.Join(dir, "credentials-served"))
	gen := envoygen.New(nil, envoygen.WithCredentials(statErr == nil), envoygen.WithAutoAddresses(model.NewAllocator()))
	caseOut := filepath.Join(out, filepath.Base(dir))
	if err := os.MkdirAll(caseOut, 0o755); err != nil {
		return err
	}
	snap := store.Snapshot()
	for _, p := range proxies {
		res, err := gen.GenerateAll(snap, p.Proxy)
		if err != nil {
			return fmt.Errorf("%s: proxy %s: %w", dir, p.Name, err)
		}
		byType := map[string][]json.RawMessage{}
		add := func(typeURL string, m proto.Message) error {
			a, err := anypb.New(m)
			if err != nil {
				return err
			}
			b, err := protojson.Marshal(a)
			if err != nil {
				return err
			}
			byType[typeURL] = append(byType[typeURL], b)
			return nil
		}
		for _, m := range res.Listeners {
			err = firstErr(err, add(resourcev3.ListenerType, m))
		}
		for _, m := range res.Routes {
			err = firstErr(err, add(resourcev3.RouteType, m))
		}
		for _, m := range res.Clusters {
			err = firstErr(err, add(resourcev3.ClusterType, m))
		}
		for _, m := range res.Endpoints {
			err = firstErr(err, add(resourcev3.EndpointType, m))
		}
		if err != nil {
			return fmt.Errorf("%s: proxy %s: %w", dir, p.Name, err)
		}
		// Re-indent through encoding/json so the committed files diff line by line.
		data, err := json.MarshalIndent(byType, "", "  ")
		if err != nil {
			return err
		}
		path := filepath.Join(caseOut, p.Name+".xds.json")
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Println(path, countOf(byType))
	}
	return nil
}

func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

func countOf(m map[string][]json.RawMessage) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf(" %s=%d", filepath.Ext(k)[1:], len(m[k]))
	}
	return s
}
