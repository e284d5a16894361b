// Package netns runs code inside a Linux network namespace. A socket belongs to the namespace
// of the thread that creates it, and a program to that of the thread that starts it, so the
// code runs on a fresh goroutine locked to its own OS thread, which is switched in and back.
package netns

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Error is a failure to enter or leave a namespace (not an error of the code run inside).
type Error struct {
	Path string
	Op   string // "open", "enter" or "leave"
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("network namespace %s: %s: %v", e.Path, e.Op, e.Err)
}
func (e *Error) Unwrap() error { return e.Err }

// Do runs fn inside the network namespace at path (a /run/netns/<name> bind mount or a
// /proc/<pid>/ns/net file) and returns fn's error. If the thread cannot be switched back it
// stays locked, and the Go runtime ends it with the goroutine rather than reuse it in the wrong
// namespace.
func Do(path string, fn func() error) error { return DoAs(path, -1, fn) }

// DoAs is Do with the thread's fsuid set to uid (when uid >= 0) while fn runs, so that the
// sockets fn creates are owned by that user: what a capture rule's owner match reads.
func DoAs(path string, uid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := inside(path, uid, fn)
		if restored {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func inside(path string, uid int, fn func() error) (restored bool, err error) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true, &Error{Path: "/proc/thread-self/ns/net", Op: "open", Err: err}
	}
	defer unix.Close(orig)
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true, &Error{Path: path, Op: "open", Err: err}
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return true, &Error{Path: path, Op: "enter", Err: err}
	}
	if uid >= 0 {
		// fsuid follows the effective uid unless set: that is what it returns to.
		_ = unix.Setfsuid(uid)
		defer func() { _ = unix.Setfsuid(unix.Geteuid()) }()
	}
	err = fn()
	if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
		return false, &Error{Path: path, Op: "leave", Err: serr}
	}
	return true, err
}
