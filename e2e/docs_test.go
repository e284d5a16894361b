package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The documentation is README.md and docs/*.md. TestDocsLinks keeps its links honest: every
// relative link names a file of the repository, and every #anchor a heading of its page, so a
// section moved or renamed cannot leave a dead link behind; and every docs page is listed in the
// README, so none is unreachable from the front page.

var (
	// mdLink is an inline link or image, [text](target) or [text](target "title").
	mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpan is inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
)

// mdPage is what a Markdown file offers to links: its anchors, and the links it makes.
type mdPage struct {
	anchors map[string]bool
	links   []mdLinkAt
}

type mdLinkAt struct {
	line   int
	target string
}

// parseMarkdown reads a page's headings (as GitHub makes their anchors) and links, leaving out
// fenced code blocks and inline code.
func parseMarkdown(text string) mdPage {
	p := mdPage{anchors: map[string]bool{}}
	seen := map[string]int{}
	inFence := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if inFence != "" {
			if strings.HasPrefix(trimmed, inFence) {
				inFence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			inFence = trimmed[:3]
			continue
		}
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimLeft(h, "#")
			if strings.HasPrefix(h, " ") {
				a := headingAnchor(h)
				if k := seen[a]; k > 0 {
					p.anchors[fmt.Sprintf("%s-%d", a, k)] = true
				} else {
					p.anchors[a] = true
				}
				seen[a]++
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			p.links = append(p.links, mdLinkAt{line: n, target: m[1]})
		}
	}
	return p
}

// headingAnchor is the anchor GitHub gives a heading: its text in lower case, without
// punctuation but hyphens and underscores, spaces made hyphens (inline code keeps its text).
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// docPages are README.md and docs/*.md, relative to the repository's root.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := []string{"README.md"}
	for _, d := range docs {
		pages = append(pages, filepath.ToSlash(must(filepath.Rel(root, d))))
	}
	return pages
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// checkDocLinks returns a problem for each link of the pages (paths relative to root) that does
// not resolve.
func checkDocLinks(root string, pages []string) ([]string, error) {
	parsed := map[string]mdPage{}
	page := func(rel string) (mdPage, error) {
		if p, ok := parsed[rel]; ok {
			return p, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return mdPage{}, err
		}
		parsed[rel] = parseMarkdown(string(b))
		return parsed[rel], nil
	}
	var problems []string
	for _, rel := range pages {
		p, err := page(rel)
		if err != nil {
			return nil, err
		}
		for _, l := range p.links {
			where := fmt.Sprintf("%s:%d: link %q", rel, l.line, l.target)
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue // off the repository: not checked (and never dialled)
			}
			file, anchor, _ := strings.Cut(l.target, "#")
			target := rel
			if file != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(rel), file)))
				if target == ".." || strings.HasPrefix(target, "../") || filepath.IsAbs(file) {
					problems = append(problems, where+": leaves the repository")
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					problems = append(problems, fmt.Sprintf("%s: no file %s", where, target))
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				problems = append(problems, where+": an anchor into a file that is not Markdown")
				continue
			}
			tp, err := page(target)
			if err != nil {
				return nil, err
			}
			if !tp.anchors[anchor] {
				problems = append(problems, fmt.Sprintf("%s: %s has no heading #%s", where, target, anchor))
			}
		}
	}
	return problems, nil
}

func TestDocsLinks(t *testing.T) {
	root := repoRoot(t)
	pages := docPages(t, root)
	if len(pages) < 2 {
		t.Fatalf("no docs pages found under %s/docs", root)
	}
	problems, err := checkDocLinks(root, pages)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}

	// Every docs page is listed in the README.
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var linked []string
	for _, l := range parseMarkdown(string(b)).links {
		file, _, _ := strings.Cut(l.target, "#")
		linked = append(linked, filepath.ToSlash(filepath.Clean(file)))
	}
	for _, p := range pages[1:] {
		if !slices.Contains(linked, p) {
			t.Errorf("README.md does not link %s (list it under Documentation)", p)
		}
	}
}

// TestDocsLinksRefuses: the checker catches each kind of dead link, and takes the live ones.
func TestDocsLinksRefuses(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, rel), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", strings.Join([]string{
		"# Top",
		"## Settings: hyper and `microservice` mode",
		"## Repeated",
		"## Repeated",
		"[ok](#top) [ok](#settings-hyper-and-microservice-mode) [ok](#repeated-1) [ok](docs/a.md#part-2)",
		"[ok](docs/a.md) [ok](Makefile) [ok](https://example.com/x#y) `[not a link](#nowhere)`",
		"[bad](#nowhere) [bad](docs/missing.md) [bad](docs/a.md#nowhere) [bad](../outside.md)",
		"[bad](Makefile#x) [bad](#repeated-2)",
		"```",
		"## Not a heading",
		"[not a link](#nowhere)",
		"```",
	}, "\n"))
	write("docs/a.md", "# A\n\n## Part 2\n\n[ok](../README.md#top) [bad](../README.md#not-a-heading)\n")
	write("Makefile", "all:\n")
	problems, err := checkDocLinks(root, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`README.md:7: link "#nowhere": README.md has no heading #nowhere`,
		`README.md:7: link "docs/missing.md": no file docs/missing.md`,
		`README.md:7: link "docs/a.md#nowhere": docs/a.md has no heading #nowhere`,
		`README.md:7: link "../outside.md": leaves the repository`,
		`README.md:8: link "Makefile#x": an anchor into a file that is not Markdown`,
		`README.md:8: link "#repeated-2": README.md has no heading #repeated-2`,
		`docs/a.md:5: link "../README.md#not-a-heading": README.md has no heading #not-a-heading`,
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
}
