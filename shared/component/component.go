// Package component runs a process's long-lived pieces under one lifecycle: each is a
// Run(ctx) error; the Manager starts them all, stops them all when one fails or the context ends,
// and turns a panic into an error instead of a crash.
package component

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
)

// Component is anything with the Run lifecycle: it runs until ctx is done and returns nil then,
// or returns an error early.
type Component interface {
	Run(ctx context.Context) error
}

// Func adapts a function to Component.
type Func func(ctx context.Context) error

// Run calls f.
func (f Func) Run(ctx context.Context) error { return f(ctx) }

// Named pairs a component with the name its errors carry.
type Named struct {
	Name string
	Component
}

// Manager runs components together.
type Manager struct {
	components []Named
}

// Add registers a component to start with Run.
func (m *Manager) Add(name string, c Component) {
	m.components = append(m.components, Named{Name: name, Component: c})
}

// Run starts every component and waits for all of them to return. The first component to fail
// (or panic) cancels the others; its error is returned. A component returning nil before ctx is
// done does not stop the others.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, c := range m.components {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runRecovered(ctx, c); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func runRecovered(ctx context.Context, c Named) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: panic: %v\n%s", c.Name, r, debug.Stack())
		}
	}()
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return nil
}
