package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sailplane.dev/e2e/framework"
)

// The README's quick start is run as written: every shell block in its section belongs to a
// step, marked by an HTML comment just before it,
//
//	<!-- quickstart: {part: files, name: client, expect: ['(?m)^v1 +\d+'], …} -->
//
// whose fields are quickstartStep's. The steps of a part run in order from the repository's
// root, in one environment (what a block exports is seen by the next ones, as in one terminal).
// A step's expected output is written in the README too, as the ```text block after its shell
// block, and its patterns must match both that block and what the commands print, so neither the
// commands nor the documented output can drift.

// quickstartStep is one marked shell block.
type quickstartStep struct {
	// Part groups the steps one test runs: "files" (TestQuickStart) or "kubernetes"
	// (TestQuickStartKubernetes).
	Part string `json:"part"`
	Name string `json:"name"`
	// Background runs the block as a long-running process (its own terminal), stopped when the
	// part ends; the part goes on once its output matches Ready.
	Background bool   `json:"background"`
	Ready      string `json:"ready"`
	// Expect are patterns the output of a foreground block must match; Fails says the block
	// must exit non-zero (an apply the API server refuses); Retry runs it again until they
	// hold, for state that settles (a proxy's ACK).
	Expect []string `json:"expect"`
	Fails  bool     `json:"fails"`
	Retry  bool     `json:"retry"`
	// Timeout bounds the step (default quickstartTimeout): Ready, or a run, or the retries.
	Timeout string `json:"timeout"`

	line       int    // of the comment, in README.md
	script     string // the shell block
	documented string // the ```text block after it, if any
	timeout    time.Duration
}

const quickstartTimeout = 2 * time.Minute

var quickstartMarker = regexp.MustCompile(`^<!-- quickstart: (.*) -->$`)

// repoRoot is the repository's root folder (the e2e module is one level down).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the e2e sources")
	}
	return filepath.Dir(filepath.Dir(file))
}

// parseQuickstart reads the steps of the README's "## Quick start" section, checking that every
// shell block there is a step and that each step's patterns match its documented output.
func parseQuickstart(readme string) ([]*quickstartStep, error) {
	var (
		steps      []*quickstartStep
		cur        *quickstartStep
		inSection  bool
		fence      string // info string of the open fence; "" outside one
		block      []string
		fenceStart int
	)
	sc := bufio.NewScanner(strings.NewReader(readme))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if fence != "" {
			if line != "```" {
				block = append(block, line)
				continue
			}
			body := strings.Join(block, "\n") + "\n"
			switch {
			case fence == "sh" && (cur == nil || cur.script != ""):
				return nil, fmt.Errorf("README.md:%d: a shell block in the quick start with no <!-- quickstart: … --> step before it", fenceStart)
			case fence == "sh":
				cur.script = body
			case fence == "text" && cur != nil && cur.script != "" && cur.documented == "":
				cur.documented = body
			}
			fence = ""
			continue
		}
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Quick start"
		case !inSection:
		case strings.HasPrefix(line, "```"):
			fence, block, fenceStart = strings.TrimPrefix(line, "```"), nil, n
		case quickstartMarker.MatchString(line):
			cur = &quickstartStep{line: n}
			if err := yaml.UnmarshalStrict([]byte(quickstartMarker.FindStringSubmatch(line)[1]), cur); err != nil {
				return nil, fmt.Errorf("README.md:%d: quickstart step: %w", n, err)
			}
			steps = append(steps, cur)
		}
	}
	if fence != "" {
		return nil, fmt.Errorf("README.md:%d: unclosed ``` block", fenceStart)
	}
	for _, s := range steps {
		if err := s.check(); err != nil {
			return nil, fmt.Errorf("README.md:%d: step %q: %w", s.line, s.Name, err)
		}
	}
	return steps, nil
}

// check validates a parsed step, and that its patterns match its documented output.
func (s *quickstartStep) check() error {
	var err error
	if s.timeout = quickstartTimeout; s.Timeout != "" {
		if s.timeout, err = time.ParseDuration(s.Timeout); err != nil {
			return fmt.Errorf("timeout: %w", err)
		}
	}
	switch {
	case s.Name == "" || s.Part == "":
		return errors.New("needs a name and a part")
	case s.script == "":
		return errors.New("no ```sh block follows it")
	case s.Background && s.Ready == "":
		return errors.New("a background step needs a ready pattern")
	case s.Background && (len(s.Expect) > 0 || s.Fails || s.Retry):
		return errors.New("a background step takes ready, not expect, fails or retry")
	case len(s.Expect) > 0 && s.documented == "":
		return errors.New("expects output but documents none (a ```text block after the shell block)")
	}
	for _, p := range s.patterns() {
		re, err := regexp.Compile(p)
		if err != nil {
			return err
		}
		if s.documented != "" && !re.MatchString(s.documented) {
			return fmt.Errorf("pattern %q does not match the documented output:\n%s", p, s.documented)
		}
	}
	return nil
}

func (s *quickstartStep) patterns() []string {
	if s.Ready != "" {
		return append([]string{s.Ready}, s.Expect...)
	}
	return s.Expect
}

// TestQuickStartParses holds the README's quick start to its format: every shell block a step,
// every documented output matched by its step's patterns.
func TestQuickStartParses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseQuickstart(string(b))
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]int{}
	for _, s := range steps {
		parts[s.Part]++
	}
	if parts["files"] == 0 || parts["kubernetes"] == 0 || len(parts) != 2 {
		t.Fatalf("want steps in parts files and kubernetes, got %v", parts)
	}
}

// TestParseQuickstartRefuses: the parser catches what would let the README drift.
func TestParseQuickstartRefuses(t *testing.T) {
	for _, tc := range []struct{ name, readme, want string }{
		{"unmarked shell block", "## Quick start\n\n```sh\nmake run\n```\n", "no <!-- quickstart"},
		{"documented output the pattern misses", "## Quick start\n<!-- quickstart: {part: files, name: a, expect: ['^v1']} -->\n```sh\necho v1\n```\n```text\nv2\n```\n", "does not match the documented output"},
		{"expected output not documented", "## Quick start\n<!-- quickstart: {part: files, name: a, expect: ['^v1']} -->\n```sh\necho v1\n```\n", "documents none"},
		{"unknown field", "## Quick start\n<!-- quickstart: {part: files, name: a, expected: ['^v1']} -->\n```sh\necho v1\n```\n", "unknown field"},
		{"background without ready", "## Quick start\n<!-- quickstart: {part: files, name: a, background: true} -->\n```sh\nsleep 1\n```\n", "ready pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseQuickstart(tc.readme)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Shell blocks outside the quick start are not its business.
	if steps, err := parseQuickstart("## Other\n\n```sh\nmake run\n```\n"); err != nil || len(steps) != 0 {
		t.Fatalf("outside the quick start: %v, %v", steps, err)
	}
}

// TestQuickStart runs the README's quick start on files: make run, the two demo servers, the
// client seeing the 80/20 split and the canary route, the bus, and proxy-status.
func TestQuickStart(t *testing.T) {
	runQuickstart(t, "files")
}

// runQuickstart runs the steps of part from the README, in order, from the repository's root.
func runQuickstart(t *testing.T, part string) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseQuickstart(string(b))
	if err != nil {
		t.Fatal(err)
	}
	// The quick start uses the default ports; say so plainly if something holds them.
	for _, addr := range []string{"127.0.0.1:15010", "127.0.0.1:15012", "127.0.0.1:15051", "127.0.0.1:15017", "127.0.0.1:17070", "127.0.0.1:17071"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the quick start's port %s is taken by another process: %v", addr, err)
		}
		l.Close()
	}
	sh := &quickstartShell{t: t, dir: root, env: quickstartEnv()}
	for _, s := range steps {
		if s.Part != part {
			continue
		}
		t.Logf("README.md:%d: step %s", s.line, s.Name)
		if s.Background {
			sh.background(s)
		} else {
			sh.run(s)
		}
	}
}

// quickstartEnv is the test's environment without what would change the commands' behaviour
// (a kubeconfig, a gRPC bootstrap), as a new user's terminal has.
func quickstartEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "KUBECONFIG" || strings.HasPrefix(name, "GRPC_XDS_BOOTSTRAP")
	})
}

// quickstartShell runs the steps' blocks with bash, keeping what they export between blocks.
type quickstartShell struct {
	t   *testing.T
	dir string
	env []string
}

// run runs a foreground step until its expectations hold (once, unless it retries).
func (sh *quickstartShell) run(s *quickstartStep) {
	t := sh.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		out, env, err := sh.exec(ctx, s.script)
		problem := s.outcome(out, err)
		if problem == nil {
			if env != nil {
				sh.env = env
			}
			return
		}
		if !s.Retry || ctx.Err() != nil {
			t.Fatalf("README.md:%d: step %s: %v\n$ %s%s", s.line, s.Name, problem, s.script, out)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("README.md:%d: step %s, retried for %v: %v\n$ %s%s", s.line, s.Name, s.timeout, problem, s.script, out)
		case <-tick.C:
		}
	}
}

// outcome says what is wrong with a foreground step's run (nil: nothing).
func (s *quickstartStep) outcome(out string, err error) error {
	var exit *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exit):
		return err
	case s.Fails && err == nil:
		return errors.New("succeeded; the README says it fails")
	case !s.Fails && err != nil:
		return err
	}
	for _, p := range s.Expect {
		if !regexp.MustCompile(p).MatchString(out) {
			return fmt.Errorf("output does not match %q", p)
		}
	}
	return nil
}

// exec runs script with bash -e in the shell's folder and environment, and returns its output
// and, when it succeeded, the environment it ended with.
func (sh *quickstartShell) exec(ctx context.Context, script string) (string, []string, error) {
	envFile := filepath.Join(sh.t.TempDir(), "env")
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script+"\nenv -0 > \"$QUICKSTART_ENV_OUT\"\n")
	cmd.Dir = sh.dir
	cmd.Env = append(slices.Clone(sh.env), "QUICKSTART_ENV_OUT="+envFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// On the deadline, end the block's whole process group, not only bash.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), nil, err
	}
	b, readErr := os.ReadFile(envFile)
	if readErr != nil {
		return string(out), nil, readErr
	}
	var env []string
	for kv := range strings.SplitSeq(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "QUICKSTART_ENV_OUT", "_", "SHLVL", "PWD", "OLDPWD":
			continue
		}
		env = append(env, kv)
	}
	return string(out), env, nil
}

// background starts a background step, as in its own terminal, waits for its ready pattern, and
// stops its process group (SIGTERM, as Ctrl-C would, then SIGKILL) when the test ends.
func (sh *quickstartShell) background(s *quickstartStep) {
	t := sh.t
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", s.script)
	cmd.Dir = sh.dir
	cmd.Env = sh.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("README.md:%d: step %s: %v", s.line, s.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("---- README.md:%d: step %s (background) ----\n$ %s%s", s.line, s.Name, s.script, out.String())
		}
	})
	ready := regexp.MustCompile(s.Ready)
	framework.Eventually(t, s.timeout, func() error {
		select {
		case <-done:
			t.Fatalf("README.md:%d: step %s exited before it was ready (%v):\n%s", s.line, s.Name, cmd.ProcessState, out.String())
		default:
		}
		if !ready.MatchString(out.String()) {
			return fmt.Errorf("step %s: output does not match %q yet", s.Name, s.Ready)
		}
		return nil
	})
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestQuickStartKubernetes runs the README's quick start on Kubernetes: make run-kube, hyper
// with no flags finding the cluster, config applied with kubectl, a Pod injected by hyper's
// webhook, an invalid VirtualService refused.
func TestQuickStartKubernetes(t *testing.T) {
	runQuickstart(t, "kubernetes")
}
