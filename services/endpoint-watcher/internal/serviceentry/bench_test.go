package serviceentry

import (
	"fmt"
	"testing"

	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
)

type discardPublisher struct{}

func (discardPublisher) Upsert(string, ...*bus.Resource) error { return nil }
func (discardPublisher) Delete(string, ...string)              {}
func (discardPublisher) Replace(string, []*bus.Resource) error { return nil }

// BenchmarkWorkloadEntryChange measures one WE address change in a namespace of 100 selector
// SEs and 1,000 WEs, out of 20 such namespaces.
func BenchmarkWorkloadEntryChange(b *testing.B) {
	x := NewIndex("Kubernetes")
	wle := func(ns string, i, gen int) *bus.Resource {
		return &bus.Resource{Name: fmt.Sprintf("%s/we-%d", ns, i), Body: &networking.WorkloadEntry{
			Address: fmt.Sprintf("10.%d.%d.%d", gen%256, i/256, i%256),
			Labels:  map[string]string{"app": fmt.Sprintf("app-%d", i%100)},
		}}
	}
	for n := range 20 {
		ns := fmt.Sprintf("ns-%d", n)
		for i := range 100 {
			if err := x.SetServiceEntry(&bus.Resource{Name: fmt.Sprintf("%s/se-%d", ns, i), Body: &networking.ServiceEntry{
				Hosts:            []string{fmt.Sprintf("app-%d.%s.example", i, ns)},
				Ports:            []*networking.ServicePort{{Name: "http", Number: 80, Protocol: "HTTP"}},
				WorkloadSelector: &networking.WorkloadSelector{Labels: map[string]string{"app": fmt.Sprintf("app-%d", i)}},
			}}); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 1000 {
			if err := x.SetWorkloadEntry(wle(ns, i, 0)); err != nil {
				b.Fatal(err)
			}
		}
	}
	x.Flush(discardPublisher{})
	for i := 0; b.Loop(); i++ {
		if err := x.SetWorkloadEntry(wle("ns-3", 42, i+1)); err != nil {
			b.Fatal(err)
		}
		x.Flush(discardPublisher{})
	}
}
