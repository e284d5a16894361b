package xdsdiff

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestSmoke(t *testing.T) {
	a, _ := anypb.New(&clusterv3.Cluster{Name: "x", LbPolicy: clusterv3.Cluster_LEAST_REQUEST})
	b, _ := anypb.New(&clusterv3.Cluster{Name: "x"})
	d, st, err := Compare(Snapshot{ClusterType: {a}}, Snapshot{ClusterType: {b}})
	if err != nil || len(d) != 1 {
		t.Fatal(d, err)
	}
	t.Log(d[0], st)
}
